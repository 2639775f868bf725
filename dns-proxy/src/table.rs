//! The lookup table built from each NDS push, expanded as Istio does (pkg/dns/client/dns.go
//! buildDNSAnswers / lookupHost), and the handle through which the agent replaces it.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::{Arc, RwLock};

use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use proto::istio::nds::NameTable;

/// TTL of every locally answered record, as Istio.
pub const LOCAL_TTL: u32 = 30;

/// Parameters of the expansion that come from the proxy's config.
#[derive(Clone, Debug)]
pub(crate) struct Expansion {
    /// Own namespace: `shortname.` resolves only for services in it.
    pub namespace: String,
    /// e.g. `svc.cluster.local` (without dots at either end).
    pub proxy_domain: String,
    /// First search domain (without trailing dot), if any.
    pub search: Option<String>,
}

#[derive(Debug, Default)]
struct HostRecords {
    v4: Vec<Record>,
    v6: Vec<Record>,
}

/// One expanded, immutable table; replaced as a whole on every push.
#[derive(Debug, Default)]
pub(crate) struct LookupTable {
    /// Every name the table knows (lowercase, trailing dot).
    all_hosts: HashSet<Box<str>>,
    /// Address records of each alt host.
    records: HashMap<Box<str>, HostRecords>,
    /// Search-domain expansions: name → CNAME record pointing at the alt host.
    cnames: HashMap<Box<str>, Record>,
    has_wildcards: bool,
}

/// A local answer: CNAMEs followed by A/AAAA records (possibly empty: NOERROR/NODATA).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct LocalAnswer {
    pub cnames: Vec<Record>,
    pub addrs: Vec<Record>,
}

impl LookupTable {
    /// Expands an NDS table (buildDNSAnswers).
    pub fn build(nt: &NameTable, exp: &Expansion) -> LookupTable {
        let mut t = LookupTable::default();
        let proxy_suffix = format!(".{}", exp.proxy_domain);
        let first_part = exp.proxy_domain.split('.').next().unwrap_or_default();
        // Deterministic order: the proto map is a HashMap.
        let mut hosts: Vec<_> = nt.table.iter().collect();
        hosts.sort_by(|a, b| a.0.cmp(b.0));
        let mut expanded: Vec<(String, Vec<IpAddr>)> = Vec::new();
        for (hostname, info) in hosts {
            let hostname = hostname.to_ascii_lowercase();
            let mut alt = Vec::new();
            if info.registry == "Kubernetes" {
                if hostname.ends_with('.') {
                    continue;
                }
                alt.push(format!("{hostname}."));
                if !exp.proxy_domain.is_empty() && hostname.ends_with(&proxy_suffix) {
                    let short = info.shortname.to_ascii_lowercase();
                    let ns = info.namespace.to_ascii_lowercase();
                    if !short.is_empty() && !ns.is_empty() {
                        alt.push(format!("{short}.{ns}."));
                        if ns == exp.namespace {
                            alt.push(format!("{short}."));
                        }
                        alt.push(format!("{short}.{ns}.{first_part}."));
                    }
                    #[allow(deprecated)]
                    for h in &info.alt_hosts {
                        alt.push(format!("{}.", h.to_ascii_lowercase().trim_end_matches('.')));
                    }
                }
            } else {
                alt.push(format!("{}.", hostname.trim_end_matches('.')));
            }
            let ips: Vec<IpAddr> = info
                .ips
                .iter()
                .filter_map(|s| IpAddr::from_str(s.trim()).ok())
                .collect();
            if ips.is_empty() {
                continue;
            }
            for h in alt {
                expanded.push((h, ips.clone()));
            }
        }
        for (h, ips) in &expanded {
            let Ok(name) = Name::from_ascii(h) else {
                continue;
            };
            t.all_hosts.insert(h.as_str().into());
            t.has_wildcards |= h.starts_with("*.");
            let entry = t.records.entry(h.as_str().into()).or_default();
            // Each list in one allocation of its final size (a pushed-to Vec keeps room for 4
            // records of ~270 bytes, and most hosts have one address; shrinking afterwards
            // leaves the spare room as holes in the heap).
            if entry.v4.capacity() == 0 && entry.v6.capacity() == 0 {
                let v4 = ips.iter().filter(|ip| ip.is_ipv4()).count();
                entry.v4.reserve_exact(v4);
                entry.v6.reserve_exact(ips.len() - v4);
            }
            for ip in ips {
                let (list, rdata) = match ip {
                    IpAddr::V4(v4) => (&mut entry.v4, RData::A(A(*v4))),
                    IpAddr::V6(v6) => (&mut entry.v6, RData::AAAA(AAAA(*v6))),
                };
                if !list.iter().any(|r| r.data == rdata) {
                    list.push(Record::from_rdata(name.clone(), LOCAL_TTL, rdata));
                }
            }
        }
        // A host named twice (merged addresses): 1,000 Services' table is 3 MB with the spare
        // room, 0.8 MB without.
        for r in t.records.values_mut() {
            r.v4.shrink_to_fit();
            r.v6.shrink_to_fit();
        }
        if let Some(search) = exp.search.as_deref().filter(|s| !s.is_empty()) {
            let suffix = format!("{search}.");
            for (h, _) in &expanded {
                if h.ends_with(&suffix) {
                    continue;
                }
                let e = format!("{h}{suffix}");
                if t.records.contains_key(e.as_str()) || t.cnames.contains_key(e.as_str()) {
                    continue;
                }
                let (Ok(owner), Ok(target)) = (Name::from_ascii(&e), Name::from_ascii(h)) else {
                    continue;
                };
                let cname = Record::from_rdata(owner, LOCAL_TTL, RData::CNAME(CNAME(target)));
                t.all_hosts.insert(e.as_str().into());
                t.has_wildcards |= e.starts_with("*.");
                t.cnames.insert(e.into(), cname);
            }
        }
        t
    }

    /// Number of names the table answers for.
    pub fn len(&self) -> usize {
        self.all_hosts.len()
    }

    /// Looks up `question` (lowercase, trailing dot) for `qtype` (lookupHost). `None` means
    /// "not ours": forward upstream. Only A and AAAA are answered locally.
    pub fn lookup(&self, question: &Name, lower: &str, qtype: RecordType) -> Option<LocalAnswer> {
        let mut host: &str = lower;
        let mut wildcard = false;
        if !self.all_hosts.contains(lower) {
            if !self.has_wildcards {
                return None;
            }
            host = self.find_wildcard(lower)?;
            wildcard = true;
        }
        if !matches!(qtype, RecordType::A | RecordType::AAAA) {
            return None;
        }
        let mut out = LocalAnswer::default();
        if let Some(cname) = self.cnames.get(host) {
            let mut c = cname.clone();
            c.name = question.clone();
            if let RData::CNAME(target) = &cname.data {
                // The target is an alt host we built, so its key exists.
                host = self
                    .records
                    .get_key_value(target.0.to_ascii().as_str())
                    .map(|(k, _)| &**k)
                    .unwrap_or(host);
            }
            out.cnames.push(c);
        }
        let addrs = self.records.get(host).map(|r| match qtype {
            RecordType::A => &r.v4,
            _ => &r.v6,
        });
        let Some(addrs) = addrs.filter(|a| !a.is_empty()) else {
            // Known name without this family: NOERROR with an empty answer (istio#31250).
            return Some(LocalAnswer::default());
        };
        out.addrs = addrs.clone();
        if wildcard && out.cnames.is_empty() {
            for r in &mut out.addrs {
                r.name = question.clone();
            }
        }
        Some(out)
    }

    /// Whether [`LookupTable::lookup`] answers `lower` for `qtype` (class IN): `false` means
    /// the query is forwarded.
    pub fn answers(&self, lower: &str, qtype: RecordType) -> bool {
        matches!(qtype, RecordType::A | RecordType::AAAA)
            && (self.all_hosts.contains(lower)
                || (self.has_wildcards && self.find_wildcard(lower).is_some()))
    }

    /// Address records of `lower` when it is a plain table host (no CNAME, no wildcard): the
    /// wire answer's lookup (`answer::local::wire`). `Some(&[])` is NODATA; `None` means "use
    /// the full lookup".
    pub fn exact_addrs(&self, lower: &str, qtype: RecordType) -> Option<&[Record]> {
        if self.cnames.contains_key(lower) {
            return None;
        }
        let r = self.records.get(lower)?;
        match qtype {
            RecordType::A => Some(&r.v4),
            RecordType::AAAA => Some(&r.v6),
            _ => None,
        }
    }

    /// Most specific wildcard covering `name`: `*.l1...ln.`, then `*.l2...ln.`, ...
    fn find_wildcard<'a>(&'a self, name: &str) -> Option<&'a str> {
        let mut rest = name;
        while let Some((_, tail)) = rest.split_once('.') {
            if tail.is_empty() {
                break;
            }
            let candidate = format!("*.{tail}");
            if let Some(k) = self.all_hosts.get(candidate.as_str()) {
                return Some(k);
            }
            rest = tail;
        }
        None
    }
}

struct State {
    expansion: Expansion,
    current: RwLock<Option<Arc<LookupTable>>>,
    raw: RwLock<Option<NameTable>>,
}

/// Shared handle to the proxy's name table: the xDS proxy calls [`TableHandle::update`] on every
/// NDS push, the status server reads [`TableHandle::is_synced`] and [`TableHandle::debug_json`].
#[derive(Clone)]
pub struct TableHandle {
    state: Arc<State>,
}

impl std::fmt::Debug for TableHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableHandle")
            .field("synced", &self.is_synced())
            .finish()
    }
}

impl TableHandle {
    pub(crate) fn new(expansion: Expansion) -> TableHandle {
        TableHandle {
            state: Arc::new(State {
                expansion,
                current: RwLock::new(None),
                raw: RwLock::new(None),
            }),
        }
    }

    /// Replaces the whole table atomically with the expansion of `table`.
    pub fn update(&self, table: &NameTable) {
        let built = Arc::new(LookupTable::build(table, &self.state.expansion));
        tracing::debug!(
            names = built.len(),
            hosts = table.table.len(),
            "DNS name table updated"
        );
        if let Ok(mut raw) = self.state.raw.write() {
            *raw = Some(table.clone());
        }
        match self.state.current.write() {
            Ok(mut cur) => *cur = Some(built),
            Err(poisoned) => *poisoned.into_inner() = Some(built),
        }
    }

    /// True once a table has been received (Istio's DNS readiness).
    pub fn is_synced(&self) -> bool {
        self.get().is_some()
    }

    /// The last NDS table in protobuf-JSON shape, for `/debug/ndsz`.
    pub fn debug_json(&self) -> serde_json::Value {
        let raw = match self.state.raw.read() {
            Ok(r) => r.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let Some(nt) = raw else {
            return serde_json::json!({});
        };
        let mut hosts: Vec<_> = nt.table.iter().collect();
        hosts.sort_by(|a, b| a.0.cmp(b.0));
        let mut table = serde_json::Map::new();
        for (host, info) in hosts {
            let mut o = serde_json::Map::new();
            if !info.ips.is_empty() {
                o.insert("ips".into(), serde_json::json!(info.ips));
            }
            for (k, v) in [
                ("registry", &info.registry),
                ("shortname", &info.shortname),
                ("namespace", &info.namespace),
            ] {
                if !v.is_empty() {
                    o.insert(k.into(), serde_json::json!(v));
                }
            }
            #[allow(deprecated)]
            if !info.alt_hosts.is_empty() {
                o.insert("altHosts".into(), serde_json::json!(info.alt_hosts));
            }
            table.insert(host.clone(), serde_json::Value::Object(o));
        }
        serde_json::json!({ "table": table })
    }

    pub(crate) fn get(&self) -> Option<Arc<LookupTable>> {
        match self.state.current.read() {
            Ok(cur) => cur.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

/// A small table exercising every expansion, for the fuzz target.
pub(crate) fn fuzz_table() -> NameTable {
    use proto::istio::nds::name_table::NameInfo;
    let mut nt = NameTable::default();
    let info = |ips: &[&str], registry: &str, short: &str, ns: &str| NameInfo {
        ips: ips.iter().map(|s| s.to_string()).collect(),
        registry: registry.into(),
        shortname: short.into(),
        namespace: ns.into(),
        ..Default::default()
    };
    nt.table.insert(
        "svc.ns1.svc.cluster.local".into(),
        info(&["10.0.0.1", "fd00::1"], "Kubernetes", "svc", "ns1"),
    );
    nt.table
        .insert("*.wild.example.com".into(), info(&["10.0.0.2"], "", "", ""));
    let many: Vec<String> = (0..60).map(|i| format!("10.1.0.{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    nt.table
        .insert("many.example.com".into(), info(&many, "", "", ""));
    nt
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proto::istio::nds::name_table::NameInfo;

    pub(crate) fn k8s(ips: &[&str], short: &str, ns: &str) -> NameInfo {
        NameInfo {
            ips: ips.iter().map(|s| s.to_string()).collect(),
            registry: "Kubernetes".into(),
            shortname: short.into(),
            namespace: ns.into(),
            ..Default::default()
        }
    }

    pub(crate) fn plain(ips: &[&str]) -> NameInfo {
        NameInfo {
            ips: ips.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    pub(crate) fn expansion() -> Expansion {
        Expansion {
            namespace: "ns1".into(),
            proxy_domain: "svc.cluster.local".into(),
            search: Some("ns1.svc.cluster.local".into()),
        }
    }

    pub(crate) fn sample() -> NameTable {
        let mut nt = NameTable::default();
        nt.table.insert(
            "productpage.ns1.svc.cluster.local".into(),
            k8s(&["10.0.0.1"], "productpage", "ns1"),
        );
        nt.table.insert(
            "reviews.ns2.svc.cluster.local".into(),
            k8s(&["10.0.0.2", "fd00::2"], "reviews", "ns2"),
        );
        nt.table
            .insert("www.example.com".into(), plain(&["10.0.0.3"]));
        nt.table
            .insert("*.wild.example.com".into(), plain(&["10.0.0.4"]));
        nt.table
            .insert("v6only.example.com".into(), plain(&["fd00::5"]));
        nt.table
            .insert("broken.example.com".into(), plain(&["not-an-ip"]));
        nt.table.insert(
            "dotted.ns1.svc.cluster.local.".into(),
            k8s(&["10.0.0.6"], "dotted", "ns1"),
        );
        nt
    }

    fn q(t: &LookupTable, name: &str, qtype: RecordType) -> Option<(Vec<String>, Vec<String>)> {
        let n = Name::from_ascii(name).unwrap();
        let lower = name.to_ascii_lowercase();
        t.lookup(&n, &lower, qtype).map(|a| {
            (
                a.cnames
                    .iter()
                    .map(|r| format!("{} {}", r.name, r.data))
                    .collect(),
                a.addrs
                    .iter()
                    .map(|r| format!("{} {} {}", r.name, r.ttl, r.data))
                    .collect(),
            )
        })
    }

    #[test]
    fn kubernetes_expansion_matches_istio() {
        let t = LookupTable::build(&sample(), &expansion());
        let a = |n| q(&t, n, RecordType::A).map(|x| x.1);
        assert_eq!(
            a("productpage.ns1.svc.cluster.local."),
            Some(vec![
                "productpage.ns1.svc.cluster.local. 30 10.0.0.1".into()
            ])
        );
        assert!(a("productpage.ns1.").is_some());
        assert!(a("productpage.").is_some(), "own namespace short name");
        assert!(a("productpage.ns1.svc.").is_some());
        assert!(a("reviews.ns2.").is_some());
        assert!(a("reviews.ns2.svc.").is_some());
        assert_eq!(a("reviews."), None, "short name only in own namespace");
        assert_eq!(
            a("dotted.ns1.svc.cluster.local."),
            None,
            "hostname ending in a dot is skipped"
        );
        assert_eq!(a("broken.example.com."), None, "no valid IP: skipped");
        assert_eq!(a("www.example.com.svc."), None, "non-k8s: hostname only");
    }

    #[test]
    fn search_domain_cname_and_family() {
        let t = LookupTable::build(&sample(), &expansion());
        let (c, a) = q(&t, "www.example.com.ns1.svc.cluster.local.", RecordType::A).unwrap();
        assert_eq!(
            c,
            vec!["www.example.com.ns1.svc.cluster.local. www.example.com.".to_string()]
        );
        assert_eq!(a, vec!["www.example.com. 30 10.0.0.3".to_string()]);
        // Already in the search domain: no CNAME doubling.
        assert_eq!(
            q(
                &t,
                "productpage.ns1.svc.cluster.local.ns1.svc.cluster.local.",
                RecordType::A
            ),
            None
        );
        assert!(q(&t, "productpage.ns1.ns1.svc.cluster.local.", RecordType::A).is_some());
        // A known name without the family: NOERROR, empty.
        assert_eq!(
            q(&t, "v6only.example.com.", RecordType::A),
            Some((vec![], vec![]))
        );
        assert_eq!(
            q(&t, "www.example.com.", RecordType::AAAA),
            Some((vec![], vec![]))
        );
        assert_eq!(
            q(&t, "reviews.ns2.svc.cluster.local.", RecordType::AAAA)
                .unwrap()
                .1,
            vec!["reviews.ns2.svc.cluster.local. 30 fd00::2".to_string()]
        );
        // Other types for known hosts are forwarded.
        assert_eq!(q(&t, "www.example.com.", RecordType::TXT), None);
        assert_eq!(q(&t, "unknown.example.com.", RecordType::A), None);
    }

    #[test]
    fn address_lists_hold_no_spare_room() {
        let t = LookupTable::build(&sample(), &expansion());
        assert!(!t.records.is_empty());
        for r in t.records.values() {
            assert_eq!(r.v4.capacity(), r.v4.len());
            assert_eq!(r.v6.capacity(), r.v6.len());
        }
    }

    #[test]
    fn wildcards_most_specific_first() {
        let mut nt = sample();
        nt.table
            .insert("*.example.com".into(), plain(&["10.0.0.9"]));
        let t = LookupTable::build(&nt, &expansion());
        let (_, a) = q(&t, "Foo.Wild.example.com.", RecordType::A).unwrap();
        assert_eq!(a, vec!["Foo.Wild.example.com. 30 10.0.0.4".to_string()]);
        let (_, a) = q(&t, "a.b.wild.example.com.", RecordType::A).unwrap();
        assert_eq!(a, vec!["a.b.wild.example.com. 30 10.0.0.4".to_string()]);
        let (_, a) = q(&t, "other.example.com.", RecordType::A).unwrap();
        assert_eq!(a, vec!["other.example.com. 30 10.0.0.9".to_string()]);
        assert_eq!(q(&t, "example.com.", RecordType::A), None);
        // Wildcard through the search-domain CNAME: the A owner is the wildcard.
        let (c, a) = q(
            &t,
            "x.wild.example.com.ns1.svc.cluster.local.",
            RecordType::A,
        )
        .unwrap();
        assert_eq!(
            c,
            vec!["x.wild.example.com.ns1.svc.cluster.local. *.wild.example.com.".to_string()]
        );
        assert_eq!(a, vec!["*.wild.example.com. 30 10.0.0.4".to_string()]);
    }

    #[test]
    fn handle_replaces_atomically_and_reports() {
        let h = TableHandle::new(expansion());
        assert!(!h.is_synced());
        assert_eq!(h.debug_json(), serde_json::json!({}));
        h.update(&sample());
        assert!(h.is_synced());
        let first = h.get().unwrap();
        assert!(first.len() > 10);
        h.update(&NameTable::default());
        assert_eq!(h.get().unwrap().len(), 0);
        assert!(
            first.all_hosts.contains("productpage."),
            "old snapshot unchanged"
        );
        h.update(&sample());
        let j = h.debug_json();
        assert_eq!(j["table"]["www.example.com"]["ips"][0], "10.0.0.3");
        assert_eq!(
            j["table"]["reviews.ns2.svc.cluster.local"]["registry"],
            "Kubernetes"
        );
    }
}
