//! Bounded cache of upstream answers honouring record TTLs; negative answers (NXDOMAIN, NODATA)
//! are kept for the SOA minimum (RFC 2308). Not in Istio; off with `DNS_PROXY_CACHE=false`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{DNSClass, RData, RecordType};

/// Upper bound on how long anything stays cached, whatever its TTL.
const MAX_TTL: u32 = 3600;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    name: Box<str>,
    qtype: RecordType,
    qclass: DNSClass,
    dnssec_ok: bool,
    checking_disabled: bool,
}

impl Key {
    pub fn of(req: &Message) -> Option<Key> {
        let q = req.queries.first()?;
        Some(Key {
            name: q.name().to_lowercase().to_ascii().into(),
            qtype: q.query_type(),
            qclass: q.query_class(),
            dnssec_ok: req.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok),
            checking_disabled: req.metadata.checking_disabled,
        })
    }

    /// The key of a plain query parsed on the wire (`lower`: lowercase with trailing dot).
    pub fn from_wire(
        lower: &str,
        qtype: RecordType,
        qclass: u16,
        dnssec_ok: bool,
        checking_disabled: bool,
    ) -> Key {
        Key {
            name: lower.into(),
            qtype,
            qclass: DNSClass::from(qclass),
            dnssec_ok,
            checking_disabled,
        }
    }
}

struct Entry {
    /// Upstream answer without its OPT record.
    msg: Message,
    stored: Instant,
    expires: Instant,
}

pub(crate) struct Cache {
    max_entries: usize,
    map: Mutex<HashMap<Key, Entry>>,
}

impl Cache {
    pub fn new(max_entries: usize) -> Cache {
        Cache {
            max_entries: max_entries.max(1),
            map: Mutex::new(HashMap::new()),
        }
    }

    /// A cached answer with TTLs aged by the time spent in the cache.
    pub fn get(&self, key: &Key, now: Instant) -> Option<Message> {
        let mut map = self.map.lock().ok()?;
        let entry = map.get(key)?;
        if now >= entry.expires {
            map.remove(key);
            return None;
        }
        let age = u32::try_from(now.duration_since(entry.stored).as_secs()).unwrap_or(u32::MAX);
        let mut msg = entry.msg.clone();
        drop(map);
        for r in msg
            .answers
            .iter_mut()
            .chain(msg.authorities.iter_mut())
            .chain(msg.additionals.iter_mut())
        {
            r.ttl = r.ttl.saturating_sub(age);
        }
        Some(msg)
    }

    /// Stores `msg` (an upstream answer to the query `key`) if it is cacheable.
    pub fn put(&self, key: Key, msg: &Message, now: Instant) {
        let Some(ttl) = cache_ttl(msg) else { return };
        if ttl == 0 {
            return;
        }
        let mut msg = msg.clone();
        msg.edns = None;
        msg.signature = None;
        let Ok(mut map) = self.map.lock() else { return };
        if map.len() >= self.max_entries && !map.contains_key(&key) {
            // Full: drop expired entries, and if that is not enough an arbitrary eighth, so
            // the O(n) sweep is paid once per n/8 inserts even under a flood of unique names.
            map.retain(|_, e| e.expires > now);
            if map.len() >= self.max_entries {
                let evict: Vec<Key> = map
                    .keys()
                    .take((self.max_entries / 8).max(1))
                    .cloned()
                    .collect();
                for k in evict {
                    map.remove(&k);
                }
            }
        }
        let expires = now + Duration::from_secs(u64::from(ttl));
        map.insert(
            key,
            Entry {
                msg,
                stored: now,
                expires,
            },
        );
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }
}

/// How long an upstream answer may be cached: the smallest answer TTL for positive answers, the
/// SOA's min(TTL, MINIMUM) for NXDOMAIN/NODATA; `None` for anything else (errors, truncated).
fn cache_ttl(msg: &Message) -> Option<u32> {
    if msg.metadata.truncation {
        return None;
    }
    let negative_ttl = || {
        msg.authorities.iter().find_map(|r| match &r.data {
            RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
            _ => None,
        })
    };
    let ttl = match msg.metadata.response_code {
        ResponseCode::NoError if !msg.answers.is_empty() => {
            msg.answers.iter().map(|r| r.ttl).min()?
        }
        ResponseCode::NoError | ResponseCode::NXDomain => negative_ttl()?,
        _ => return None,
    };
    Some(ttl.min(MAX_TTL))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{MessageType, OpCode, Query};
    use hickory_proto::rr::rdata::{A, SOA};
    use hickory_proto::rr::{Name, Record};
    use std::net::Ipv4Addr;

    fn query(name: &str) -> Message {
        let mut m = Message::new(1, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        m
    }

    fn answer(name: &str, ttl: u32) -> Message {
        let mut m = query(name);
        m.metadata.message_type = MessageType::Response;
        m.add_answer(Record::from_rdata(
            Name::from_ascii(name).unwrap(),
            ttl,
            RData::A(A(Ipv4Addr::new(10, 0, 0, 1))),
        ));
        m
    }

    fn nxdomain(name: &str, soa_ttl: u32, minimum: u32) -> Message {
        let mut m = query(name);
        m.metadata.message_type = MessageType::Response;
        m.metadata.response_code = ResponseCode::NXDomain;
        let zone = Name::from_ascii("example.com.").unwrap();
        let soa = SOA::new(zone.clone(), zone.clone(), 1, 60, 60, 60, minimum);
        m.add_authority(Record::from_rdata(zone, soa_ttl, RData::SOA(soa)));
        m
    }

    #[test]
    fn honours_ttl_and_ages_records() {
        let c = Cache::new(10);
        let t0 = Instant::now();
        let key = Key::of(&query("A.example.com.")).unwrap();
        assert_eq!(
            key,
            Key::of(&query("a.example.com.")).unwrap(),
            "case-insensitive"
        );
        c.put(key.clone(), &answer("a.example.com.", 10), t0);
        let hit = c.get(&key, t0 + Duration::from_secs(4)).unwrap();
        assert_eq!(hit.answers[0].ttl, 6);
        assert!(c.get(&key, t0 + Duration::from_secs(10)).is_none());
        assert_eq!(c.len(), 0, "expired entry removed");
    }

    #[test]
    fn negative_answers_use_soa_minimum() {
        assert_eq!(cache_ttl(&nxdomain("x.example.com.", 300, 5)), Some(5));
        assert_eq!(cache_ttl(&nxdomain("x.example.com.", 2, 50)), Some(2));
        let mut no_soa = nxdomain("x.example.com.", 1, 1);
        no_soa.authorities.clear();
        assert_eq!(cache_ttl(&no_soa), None, "no SOA: not cached");
        let mut servfail = answer("a.example.com.", 10);
        servfail.metadata.response_code = ResponseCode::ServFail;
        assert_eq!(cache_ttl(&servfail), None);
        let mut tc = answer("a.example.com.", 10);
        tc.metadata.truncation = true;
        assert_eq!(cache_ttl(&tc), None);
        assert_eq!(cache_ttl(&answer("a.example.com.", 999_999)), Some(MAX_TTL));
    }

    #[test]
    fn bounded() {
        let c = Cache::new(3);
        let t0 = Instant::now();
        for i in 0..10 {
            let name = format!("h{i}.example.com.");
            c.put(Key::of(&query(&name)).unwrap(), &answer(&name, 100 + i), t0);
        }
        assert!(c.len() <= 3);
        let last = Key::of(&query("h9.example.com.")).unwrap();
        assert!(c.get(&last, t0).is_some());
    }
}
