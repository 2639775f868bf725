//! Bounded cache of upstream answers honouring record TTLs; negative answers (NXDOMAIN, NODATA)
//! are kept for the SOA minimum (RFC 2308). Not in Istio; off with `DNS_PROXY_CACHE=false`.
//!
//! Bounded in bytes as well as entries: an answer is kept as its wire bytes (parsed again on a
//! hit), so what an entry costs is known exactly: its bytes, its name and [`ENTRY_OVERHEAD`].
//! A truncated answer retried over TCP can be 64 KiB on the wire and ~1 MiB parsed; held
//! parsed, 10,000 of them were ~11 GB. An answer larger than an eighth of the budget is not
//! cached. Answers without a question section are never cached.
//!
//! Serve-stale (RFC 8767, not in Istio; on by default, `DNS_PROXY_SERVE_STALE`): an answer is
//! kept past its TTL for up to [`StalePolicy::max_stale`] (1 day); when every upstream fails,
//! or has not answered within the client response timer ([`StalePolicy::client_timer`],
//! 1.8 s), it is given with the stale TTL (30 s) instead of SERVFAIL or a wait
//! ([`Lookup::Stale`], [`Cache::stale`]). Prefetch (`DNS_PROXY_PREFETCH`): a name asked for again in the last tenth
//! of its TTL is refreshed in the background before it expires ([`Lookup::Fresh`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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

/// What an entry costs besides its wire bytes and name: the map slot, the key, the instants and
/// the shared buffer's header.
pub(crate) const ENTRY_OVERHEAD: usize = 128;

struct Entry {
    /// Upstream answer without its OPT record, encoded.
    wire: Arc<[u8]>,
    stored: Instant,
    expires: Instant,
    /// The TTL it was cached with.
    ttl: u32,
    /// A prefetch was asked for (once per stored answer).
    prefetched: bool,
}

/// How long answers are kept and given past their TTL when the upstreams fail (RFC 8767).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StalePolicy {
    /// How long past its TTL an answer may still be given (`DNS_PROXY_STALE_MAX`, 1 day).
    pub max_stale: Duration,
    /// The TTL of a stale answer, and how long after an upstream failure stale answers are
    /// given without asking upstream again (`DNS_PROXY_STALE_TTL`, 30 s, RFC 8767's figure).
    pub stale_ttl: Duration,
    /// RFC 8767's client response timer (`DNS_PROXY_STALE_CLIENT_TIMER`, 1.8 s, its figure):
    /// how long a client waits for the upstream when a stale answer is kept for its query;
    /// then it gets the stale answer, and the upstream query goes on to refresh the cache.
    /// Zero: the stale answer at once, refreshed in the background.
    pub client_timer: Duration,
}

/// RFC 8767's suggested client response timer.
pub const DEFAULT_CLIENT_TIMER: Duration = Duration::from_millis(1800);

impl Default for StalePolicy {
    fn default() -> Self {
        StalePolicy {
            max_stale: Duration::from_secs(86_400),
            stale_ttl: Duration::from_secs(30),
            client_timer: DEFAULT_CLIENT_TIMER,
        }
    }
}

/// What the cache holds for a query.
pub(crate) enum Lookup {
    /// A live answer, TTLs aged; `prefetch`: refresh it now (asked for in its TTL's last tenth).
    Fresh {
        msg: Message,
        prefetch: bool,
    },
    /// Expired, within the stale window: given only if the upstreams fail or are slower than
    /// the client response timer.
    Stale,
    Miss,
}

fn cost(key: &Key, wire: &[u8]) -> usize {
    wire.len() + key.name.len() + ENTRY_OVERHEAD
}

#[derive(Default)]
struct Entries {
    map: HashMap<Key, Entry>,
    /// The sum of every entry's [`cost`].
    bytes: usize,
}

impl Entries {
    fn remove(&mut self, key: &Key) {
        if let Some(e) = self.map.remove(key) {
            self.bytes -= cost(key, &e.wire);
        }
    }
}

pub(crate) struct Cache {
    max_entries: usize,
    max_bytes: usize,
    /// Serve-stale; `None`: an answer is gone at its TTL.
    stale: Option<StalePolicy>,
    prefetch: bool,
    entries: Mutex<Entries>,
}

impl Cache {
    /// A cache without serve-stale or prefetch ([`Cache::serving_stale`]).
    pub fn new(max_entries: usize, max_bytes: usize) -> Cache {
        Cache {
            max_entries: max_entries.max(1),
            max_bytes,
            stale: None,
            prefetch: false,
            entries: Mutex::default(),
        }
    }

    /// With serve-stale (`stale`) and prefetch.
    pub fn serving_stale(mut self, stale: Option<StalePolicy>, prefetch: bool) -> Cache {
        self.stale = stale;
        self.prefetch = prefetch;
        self
    }

    /// The stale policy, when serve-stale is on.
    pub fn stale_policy(&self) -> Option<StalePolicy> {
        self.stale
    }

    /// When an entry is gone for good: its expiry, plus the stale window.
    fn kept_until(&self, e: &Entry) -> Instant {
        e.expires + self.stale.map_or(Duration::ZERO, |s| s.max_stale)
    }

    /// A live cached answer with TTLs aged by the time spent in the cache.
    #[cfg(test)]
    pub fn get(&self, key: &Key, now: Instant) -> Option<Message> {
        match self.lookup(key, now) {
            Lookup::Fresh { msg, .. } => Some(msg),
            Lookup::Stale | Lookup::Miss => None,
        }
    }

    /// What the cache holds for `key` (see [`Lookup`]).
    pub fn lookup(&self, key: &Key, now: Instant) -> Lookup {
        let Ok(mut entries) = self.entries.lock() else {
            return Lookup::Miss;
        };
        let Some(entry) = entries.map.get_mut(key) else {
            return Lookup::Miss;
        };
        if now >= entry.expires {
            if now < entry.expires + self.stale.map_or(Duration::ZERO, |s| s.max_stale) {
                return Lookup::Stale;
            }
            entries.remove(key);
            return Lookup::Miss;
        }
        let left = entry.expires.duration_since(now);
        let prefetch = self.prefetch
            && !entry.prefetched
            && entry.ttl >= 10
            && left < Duration::from_secs(u64::from(entry.ttl)) / 10;
        if prefetch {
            entry.prefetched = true;
        }
        let age = u32::try_from(now.duration_since(entry.stored).as_secs()).unwrap_or(u32::MAX);
        let wire = entry.wire.clone();
        drop(entries);
        match Message::from_vec(&wire) {
            Ok(mut msg) => {
                for r in records(&mut msg) {
                    r.ttl = r.ttl.saturating_sub(age);
                }
                Lookup::Fresh { msg, prefetch }
            }
            Err(_) => Lookup::Miss,
        }
    }

    /// The answer kept for `key`, live or within the stale window, with every TTL set to the
    /// stale TTL (RFC 8767): for when every upstream failed. `None` without serve-stale.
    pub fn stale(&self, key: &Key, now: Instant) -> Option<Message> {
        let policy = self.stale?;
        let entries = self.entries.lock().ok()?;
        let entry = entries.map.get(key)?;
        if now >= entry.expires + policy.max_stale {
            return None;
        }
        let wire = entry.wire.clone();
        drop(entries);
        let mut msg = Message::from_vec(&wire).ok()?;
        let ttl = u32::try_from(policy.stale_ttl.as_secs()).unwrap_or(u32::MAX);
        for r in records(&mut msg) {
            r.ttl = ttl;
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
        let Ok(wire) = msg.to_vec() else { return };
        let size = cost(&key, &wire);
        if size > self.max_bytes / 8 {
            return;
        }
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        entries.remove(&key);
        if entries.map.len() >= self.max_entries || entries.bytes + size > self.max_bytes {
            // Full: drop expired entries, and if that is not enough an arbitrary eighth (of
            // the entries, or of the bytes), so the O(n) sweep is paid once per n/8 inserts
            // even under a flood of unique names.
            let keep = |e: &Entry| self.kept_until(e) > now;
            entries.map.retain(|_, e| keep(e));
            entries.bytes = entries.map.iter().map(|(k, e)| cost(k, &e.wire)).sum();
            let (keep_entries, keep_bytes) = (
                self.max_entries - (self.max_entries / 8).max(1),
                self.max_bytes - self.max_bytes / 8 - size,
            );
            let over = entries.map.len() >= self.max_entries || entries.bytes > keep_bytes;
            if over {
                let mut evict = Vec::new();
                let (mut n, mut bytes) = (entries.map.len(), entries.bytes);
                // Stale answers go first, then any.
                let (stale, live): (Vec<_>, Vec<_>) =
                    entries.map.iter().partition(|(_, e)| e.expires <= now);
                for (k, e) in stale.into_iter().chain(live) {
                    if n <= keep_entries && bytes <= keep_bytes {
                        break;
                    }
                    n -= 1;
                    bytes -= cost(k, &e.wire);
                    evict.push(k.clone());
                }
                for k in evict {
                    entries.remove(&k);
                }
            }
        }
        let expires = now + Duration::from_secs(u64::from(ttl));
        entries.bytes += size;
        entries.map.insert(
            key,
            Entry {
                wire: wire.into(),
                stored: now,
                expires,
                ttl,
                prefetched: false,
            },
        );
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.map.len()).unwrap_or(0)
    }

    /// The bytes the entries cost (see [`cost`]).
    pub fn bytes(&self) -> usize {
        self.entries.lock().map(|e| e.bytes).unwrap_or(0)
    }
}

fn records(msg: &mut Message) -> impl Iterator<Item = &mut hickory_proto::rr::Record> {
    msg.answers
        .iter_mut()
        .chain(msg.authorities.iter_mut())
        .chain(msg.additionals.iter_mut())
}

/// How long an upstream answer may be cached: the smallest answer TTL for positive answers, the
/// SOA's min(TTL, MINIMUM) for NXDOMAIN/NODATA; `None` for anything else (errors, truncated).
fn cache_ttl(msg: &Message) -> Option<u32> {
    // Truncated, or without the question it answers (anyone who guessed the id could have
    // sent it).
    if msg.metadata.truncation || msg.queries.is_empty() {
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
        let c = Cache::new(10, 1 << 20);
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
        let mut no_question = nxdomain("x.example.com.", 300, 300);
        no_question.queries.clear();
        assert_eq!(cache_ttl(&no_question), None, "no question: not cached");
        assert_eq!(cache_ttl(&answer("a.example.com.", 999_999)), Some(MAX_TTL));
    }

    /// Serve-stale keeps an expired answer for the stale window (given with the stale TTL);
    /// prefetch is asked for once, in the TTL's last tenth.
    #[test]
    fn stale_window_and_prefetch() {
        let policy = StalePolicy {
            max_stale: Duration::from_secs(100),
            stale_ttl: Duration::from_secs(30),
            ..StalePolicy::default()
        };
        let c = Cache::new(10, 1 << 20).serving_stale(Some(policy), true);
        let t0 = Instant::now();
        let key = Key::of(&query("a.example.com.")).unwrap();
        c.put(key.clone(), &answer("a.example.com.", 60), t0);
        let fresh = |at: u64| match c.lookup(&key, t0 + Duration::from_secs(at)) {
            Lookup::Fresh { prefetch, .. } => Some(prefetch),
            _ => None,
        };
        assert_eq!(fresh(10), Some(false));
        assert_eq!(fresh(55), Some(true), "last tenth: prefetch");
        assert_eq!(fresh(56), Some(false), "asked for once");
        assert!(matches!(
            c.lookup(&key, t0 + Duration::from_secs(61)),
            Lookup::Stale
        ));
        let stale = c.stale(&key, t0 + Duration::from_secs(120)).unwrap();
        assert_eq!(stale.answers[0].ttl, 30);
        assert!(c.get(&key, t0 + Duration::from_secs(120)).is_none());
        // Past the stale window: gone.
        assert!(matches!(
            c.lookup(&key, t0 + Duration::from_secs(161)),
            Lookup::Miss
        ));
        assert!(c.stale(&key, t0 + Duration::from_secs(161)).is_none());
        // Without serve-stale, an expired answer is gone at once.
        let plain = Cache::new(10, 1 << 20);
        plain.put(key.clone(), &answer("a.example.com.", 60), t0);
        assert!(matches!(
            plain.lookup(&key, t0 + Duration::from_secs(61)),
            Lookup::Miss
        ));
        assert!(plain.stale(&key, t0).is_none());
    }

    #[test]
    fn bounded() {
        let c = Cache::new(3, 1 << 20);
        let t0 = Instant::now();
        for i in 0..10 {
            let name = format!("h{i}.example.com.");
            c.put(Key::of(&query(&name)).unwrap(), &answer(&name, 100 + i), t0);
        }
        assert!(c.len() <= 3);
        let last = Key::of(&query("h9.example.com.")).unwrap();
        assert!(c.get(&last, t0).is_some());
    }

    /// An answer with `n` A records (~16 bytes each on the wire, names compressed).
    fn large_answer(name: &str, n: u32) -> Message {
        let mut m = query(name);
        m.metadata.message_type = MessageType::Response;
        for i in 0..n {
            m.add_answer(Record::from_rdata(
                Name::from_ascii(name).unwrap(),
                300,
                RData::A(A(Ipv4Addr::from(0x0a00_0000 + i))),
            ));
        }
        m
    }

    #[test]
    fn bounded_in_bytes_by_the_answers_real_size() {
        const BUDGET: usize = 1 << 20;
        let c = Cache::new(1_000_000, BUDGET);
        let t0 = Instant::now();
        // ~64 KiB answers (4,000 records: what a truncated answer retried over TCP can hold).
        for i in 0..200 {
            let name = format!("big{i}.example.com.");
            c.put(
                Key::of(&query(&name)).unwrap(),
                &large_answer(&name, 4000),
                t0,
            );
            assert!(c.bytes() <= BUDGET, "{} bytes after {i}", c.bytes());
        }
        assert!(c.len() >= 8, "the budget holds {} answers", c.len());
        let entries = c.entries.lock().unwrap();
        let real: usize = entries.map.iter().map(|(k, e)| cost(k, &e.wire)).sum();
        assert_eq!(entries.bytes, real, "the count follows the entries");
        assert!(entries.map.values().all(|e| e.wire.len() > 30_000));
        drop(entries);
        // The newest answer is there, whole.
        let last = Key::of(&query("big199.example.com.")).unwrap();
        let sent = large_answer("big199.example.com.", 2000);
        let on_the_wire = Message::from_vec(&sent.to_vec().unwrap()).unwrap();
        assert_eq!(c.get(&last, t0).unwrap().answers, on_the_wire.answers);
        // An answer over an eighth of the budget is not kept.
        let c = Cache::new(10, 128 << 10);
        let key = Key::of(&query("huge.example.com.")).unwrap();
        c.put(key.clone(), &large_answer("huge.example.com.", 2000), t0);
        assert!(c.get(&key, t0).is_none());
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn replacing_an_entry_keeps_the_byte_count() {
        let c = Cache::new(10, 1 << 20);
        let t0 = Instant::now();
        let key = Key::of(&query("a.example.com.")).unwrap();
        c.put(key.clone(), &large_answer("a.example.com.", 100), t0);
        c.put(key.clone(), &large_answer("a.example.com.", 2), t0);
        assert_eq!(c.len(), 1);
        assert!(c.bytes() < ENTRY_OVERHEAD + 200, "{}", c.bytes());
        assert_eq!(c.get(&key, t0).unwrap().answers.len(), 2);
    }
}
