//! Warm start (`XDS_PROXY_PREFETCH`, not in Istio): the upstream ADS stream is opened when
//! Envoy's bootstrap is written, with the bootstrap's node, and subscribes to what Envoy asks
//! first (CDS and LDS, wildcard) while Envoy boots. The first stream Envoy opens on the XDS
//! socket takes that stream over: each type's responses are held ([`Held`]) until Envoy asks
//! for the type, then handed to Envoy as istiod sent them (nonces, versions) and in istiod's
//! order, and Envoy's request that matches the prefetched subscription is not repeated
//! upstream. From then on the stream is Envoy's: its ACKs and NACKs answer istiod's nonces,
//! its later requests are relayed.
//!
//! - The names the held CDS and LDS responses give (EDS clusters' service names, the RDS route
//!   names of HTTP connection managers: [`names`]) are subscribed too, as Envoy will ask for
//!   them next, while Envoy has not taken the type that names them; their responses are held
//!   as well. When Envoy rejects such a CDS or LDS response, what it named and Envoy did not
//!   ask for yet is let go (Delta: unsubscribed).
//! - SotW keeps the newest response of each held type (a SotW response is the whole state);
//!   Delta keeps every response, in order (each is a change to the previous ones).
//! - Held responses are bounded in bytes ([`MAX_HELD`]): past it the warm stream ends, and
//!   Envoy's stream (if it took the warm one over) ends with UNAVAILABLE; Envoy's next stream
//!   is relayed as without prefetch.
//! - Only Envoy's first stream is warm, and only when it speaks the flavor the bootstrap names
//!   (`ads_config.api_type`); otherwise the warm stream is closed and Envoy's is relayed as
//!   without prefetch.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use proto::envoy::config::core::v3::{Locality, Node};
use proto::google::protobuf::{ListValue, Struct, Value, value::Kind};
use proto::type_url;

use super::codec::RawResponse;

pub(crate) mod names;
use names::Update;

/// Most bytes of responses held for Envoy before it asks for them.
pub(crate) const MAX_HELD: usize = 64 << 20;

/// Reading the bootstrap the prefetch takes its node from.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read Envoy's bootstrap {path} for the xDS prefetch: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("Envoy's bootstrap {path} does not parse as JSON or YAML: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("Envoy's bootstrap {path} has no {what} for the xDS prefetch")]
    Missing { path: PathBuf, what: &'static str },
    #[error(
        "Envoy's bootstrap {path} names ads_config.api_type {api_type:?}; the xDS prefetch knows GRPC and DELTA_GRPC"
    )]
    ApiType { path: PathBuf, api_type: String },
}

/// What the warm stream opens with: Envoy's node and ADS flavor, as its bootstrap names them.
#[derive(Debug, Clone, PartialEq)]
pub struct Prefetch {
    pub node: Node,
    /// `DELTA_GRPC` (else `GRPC`, SotW).
    pub delta: bool,
}

impl Prefetch {
    /// Reads the node and `dynamic_resources.ads_config.api_type` from a written bootstrap
    /// (JSON, or YAML from a YAML template).
    pub fn from_bootstrap(path: &Path) -> Result<Prefetch, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        // YAML is a superset of JSON: one reader for both.
        let doc: serde_json::Value = serde_yaml::from_str(&text).map_err(|e| Error::Parse {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::from_value(&doc).map_err(|e| match e {
            Err2::Missing(what) => Error::Missing {
                path: path.to_path_buf(),
                what,
            },
            Err2::ApiType(api_type) => Error::ApiType {
                path: path.to_path_buf(),
                api_type,
            },
        })
    }

    fn from_value(doc: &serde_json::Value) -> Result<Prefetch, Err2> {
        let node = doc
            .get("node")
            .and_then(serde_json::Value::as_object)
            .ok_or(Err2::Missing("node"))?;
        let api_type = doc
            .pointer("/dynamic_resources/ads_config/api_type")
            .and_then(serde_json::Value::as_str)
            .ok_or(Err2::Missing("dynamic_resources.ads_config.api_type"))?;
        let delta = match api_type {
            "DELTA_GRPC" => true,
            "GRPC" => false,
            other => return Err(Err2::ApiType(other.to_string())),
        };
        let text = |k: &str| {
            node.get(k)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let id = text("id");
        if id.is_empty() {
            return Err(Err2::Missing("node.id"));
        }
        let locality = node.get("locality").and_then(|l| {
            let s = |k: &str| {
                l.get(k)
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let loc = Locality {
                region: s("region"),
                zone: s("zone"),
                sub_zone: s("sub_zone"),
            };
            (loc != Locality::default()).then_some(loc)
        });
        let metadata = node
            .get("metadata")
            .and_then(serde_json::Value::as_object)
            .map(to_struct);
        Ok(Prefetch {
            node: Node {
                id,
                cluster: text("cluster"),
                metadata,
                locality,
                ..Default::default()
            },
            delta,
        })
    }
}

enum Err2 {
    Missing(&'static str),
    ApiType(String),
}

fn to_struct(map: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
    }
}

fn to_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(to_value).collect(),
        }),
        J::Object(o) => Kind::StructValue(to_struct(o)),
    };
    Value { kind: Some(kind) }
}

/// The types the warm stream subscribes to first, wildcard, in Envoy's order.
pub(crate) const FIRST: [&str; 2] = [type_url::CLUSTER, type_url::LISTENER];

/// One held type: what the warm stream subscribed to and istiod's responses Envoy has not had.
#[derive(Debug)]
struct HeldType {
    names: Vec<String>,
    responses: VecDeque<RawResponse>,
}

/// What becomes of Envoy's request for a type.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Not a held type: relayed as ever.
    Relay,
    /// Envoy asked for what the warm stream subscribed to: its held responses go to Envoy and
    /// the request is not repeated upstream.
    Served,
    /// Envoy asked for other names: the held responses go to Envoy (Delta) or are dropped
    /// (SotW, whose next response istiod sends for the names Envoy asked), and the request is
    /// relayed.
    Changed,
}

/// A subscription the warm stream makes (or drops) for the type Envoy asks for next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Follow {
    pub(crate) type_url: &'static str,
    /// Every name now subscribed (SotW's request).
    pub(crate) names: Vec<String>,
    /// Delta's request: names subscribed and unsubscribed.
    pub(crate) added: Vec<String>,
    pub(crate) removed: Vec<String>,
}

/// The responses held for Envoy, per type, until Envoy asks for the type.
#[derive(Debug)]
pub(crate) struct Held {
    delta: bool,
    types: HashMap<String, HeldType>,
    /// Responses released for Envoy, in istiod's order, not yet handed to Envoy's stream.
    ready: VecDeque<RawResponse>,
    bytes: usize,
    /// Per CDS and LDS: each resource's names for the next type (SotW: one entry, the whole).
    children: HashMap<String, BTreeMap<String, Vec<String>>>,
    /// Whether Envoy's stream has taken the warm one over.
    pub(crate) attached: bool,
}

/// The held responses passed [`MAX_HELD`].
#[derive(Debug)]
pub(crate) struct Overflow;

/// Resource names as a set, a wildcard (empty, or `*`) as empty.
fn name_set(names: &[String]) -> BTreeSet<&str> {
    names
        .iter()
        .map(String::as_str)
        .filter(|n| *n != "*")
        .collect()
}

impl Held {
    /// Holds the types of `subscribed` (type URL, resource names).
    pub(crate) fn new<'a>(delta: bool, subscribed: impl IntoIterator<Item = &'a str>) -> Held {
        Held {
            delta,
            types: subscribed
                .into_iter()
                .map(|t| {
                    (
                        t.to_string(),
                        HeldType {
                            names: Vec::new(),
                            responses: VecDeque::new(),
                        },
                    )
                })
                .collect(),
            ready: VecDeque::new(),
            bytes: 0,
            children: HashMap::new(),
            attached: false,
        }
    }

    /// True when `type_url`'s responses are held and name what Envoy asks for next.
    pub(crate) fn follows(&self, type_url: &str) -> bool {
        names::next_type(type_url).is_some() && self.types.contains_key(type_url)
    }

    fn child_names(&self, parent: &str) -> BTreeSet<String> {
        self.children
            .get(parent)
            .into_iter()
            .flat_map(|m| m.values().flatten().cloned())
            .collect()
    }

    /// A held CDS or LDS response's `update`: the subscription to make when the names of the
    /// next type change. The next type is held from then on; in SotW, a type whose names are
    /// all gone is let go (an empty SotW request would be a wildcard).
    pub(crate) fn follow(&mut self, parent: &str, update: Update) -> Option<Follow> {
        let child = names::next_type(parent)?;
        if !self.types.contains_key(parent) {
            return None;
        }
        let before = self.child_names(parent);
        let map = self.children.entry(parent.to_string()).or_default();
        match update {
            Update::Replace(names) => {
                map.clear();
                map.insert(String::new(), names);
            }
            Update::Change { upserts, removed } => {
                for (name, names) in upserts {
                    map.insert(name, names);
                }
                for name in removed {
                    map.remove(&name);
                }
            }
        }
        let after = self.child_names(parent);
        if before == after {
            return None;
        }
        let follow = Follow {
            type_url: child,
            names: after.iter().cloned().collect(),
            added: after.difference(&before).cloned().collect(),
            removed: before.difference(&after).cloned().collect(),
        };
        if follow.names.is_empty() && !self.delta {
            self.let_go(child);
            return None;
        }
        let t = self
            .types
            .entry(child.to_string())
            .or_insert_with(|| HeldType {
                names: Vec::new(),
                responses: VecDeque::new(),
            });
        t.names = follow.names.clone();
        Some(follow)
    }

    /// Stops holding `type_url`: its responses go.
    fn let_go(&mut self, type_url: &str) {
        if let Some(t) = self.types.remove(type_url) {
            self.bytes -= t.responses.iter().map(|r| r.bytes.len()).sum::<usize>();
        }
    }

    /// Envoy rejected a response of `parent`: the next type it named is let go, as Envoy may
    /// never ask for it (Delta: unsubscribed, so that Envoy's own request is a new one).
    pub(crate) fn rejected(&mut self, parent: &str) -> Option<Follow> {
        let child = names::next_type(parent)?;
        let t = self.types.get(child)?;
        let names = t.names.clone();
        self.let_go(child);
        self.children.remove(parent);
        (self.delta && !names.is_empty()).then(|| Follow {
            type_url: child,
            names: Vec::new(),
            added: Vec::new(),
            removed: names,
        })
    }

    /// True while some type is still held for Envoy.
    pub(crate) fn holding(&self) -> bool {
        !self.types.is_empty()
    }

    /// True when nothing is held nor waiting to be handed over: the warm state can go.
    pub(crate) fn finished(&self) -> bool {
        self.types.is_empty() && self.ready.is_empty()
    }

    /// Keeps a response of a held type (`Ok(None)`); a response of another type is returned
    /// to be relayed, after what [`Held::take_ready`] gives.
    pub(crate) fn keep(&mut self, resp: RawResponse) -> Result<Option<RawResponse>, Overflow> {
        let Some(t) = self.types.get_mut(resp.type_url()) else {
            return Ok(Some(resp));
        };
        if !self.delta {
            // A SotW response is the type's whole state: the newest replaces the others.
            for old in t.responses.drain(..) {
                self.bytes -= old.bytes.len();
            }
        }
        self.bytes += resp.bytes.len();
        t.responses.push_back(resp);
        if self.bytes > MAX_HELD {
            return Err(Overflow);
        }
        Ok(None)
    }

    /// Envoy's request for `type_url`: `initial` holds its names when it is a first request
    /// (no nonce, no error), `None` otherwise.
    pub(crate) fn claim(&mut self, type_url: &str, initial: Option<&[String]>) -> Claim {
        let Some(t) = self.types.remove(type_url) else {
            return Claim::Relay;
        };
        let bytes: usize = t.responses.iter().map(|r| r.bytes.len()).sum();
        self.bytes -= bytes;
        let same = initial.is_some_and(|names| name_set(names) == name_set(&t.names));
        if same || self.delta {
            self.ready.extend(t.responses);
        }
        if same { Claim::Served } else { Claim::Changed }
    }

    /// The responses released for Envoy, in istiod's order.
    pub(crate) fn take_ready(&mut self) -> VecDeque<RawResponse> {
        std::mem::take(&mut self.ready)
    }

    /// A new upstream stream replaces the one whose responses are held: it sends every held
    /// type again (Envoy acknowledged none of it), so what the old one sent goes.
    pub(crate) fn new_generation(&mut self) {
        for t in self.types.values_mut() {
            t.responses.clear();
        }
        self.ready.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use prost::Message;
    use proto::envoy::service::discovery::v3::DiscoveryResponse;

    use super::*;

    fn resp(t: &str, nonce: &str) -> RawResponse {
        let r = DiscoveryResponse {
            type_url: t.into(),
            nonce: nonce.into(),
            version_info: nonce.into(),
            ..Default::default()
        };
        RawResponse::new(Bytes::from(r.encode_to_vec())).unwrap()
    }

    fn nonces(q: VecDeque<RawResponse>) -> Vec<String> {
        q.into_iter().map(|r| r.head.nonce).collect()
    }

    #[test]
    fn sotw_keeps_the_newest_and_serves_it_on_a_matching_request() {
        let mut h = Held::new(false, FIRST);
        assert!(h.keep(resp(type_url::CLUSTER, "c1")).unwrap().is_none());
        assert!(h.keep(resp(type_url::CLUSTER, "c2")).unwrap().is_none());
        assert!(h.keep(resp(type_url::ROUTE, "r1")).unwrap().is_some());
        assert_eq!(h.claim(type_url::CLUSTER, Some(&[])), Claim::Served);
        assert_eq!(nonces(h.take_ready()), ["c2"]);
        assert_eq!(h.claim(type_url::CLUSTER, Some(&[])), Claim::Relay);
        assert!(h.holding());
        // `*` is the wildcard too.
        assert_eq!(
            h.claim(type_url::LISTENER, Some(&["*".into()])),
            Claim::Served
        );
        assert!(h.finished());
    }

    #[test]
    fn delta_keeps_every_response_in_order() {
        let mut h = Held::new(true, FIRST);
        for n in ["c1", "c2"] {
            h.keep(resp(type_url::CLUSTER, n)).unwrap();
        }
        h.keep(resp(type_url::LISTENER, "l1")).unwrap();
        assert_eq!(h.claim(type_url::LISTENER, Some(&[])), Claim::Served);
        assert_eq!(h.claim(type_url::CLUSTER, Some(&[])), Claim::Served);
        assert_eq!(nonces(h.take_ready()), ["l1", "c1", "c2"]);
    }

    #[test]
    fn other_names_release_delta_and_drop_sotw() {
        let mut sotw = Held::new(false, FIRST);
        sotw.keep(resp(type_url::CLUSTER, "c1")).unwrap();
        assert_eq!(
            sotw.claim(type_url::CLUSTER, Some(&["a".into()])),
            Claim::Changed
        );
        assert!(sotw.take_ready().is_empty());
        let mut delta = Held::new(true, FIRST);
        delta.keep(resp(type_url::CLUSTER, "c1")).unwrap();
        // Not a first request (a nonce): released, and relayed.
        assert_eq!(delta.claim(type_url::CLUSTER, None), Claim::Changed);
        assert_eq!(nonces(delta.take_ready()), ["c1"]);
    }

    #[test]
    fn bounded_in_bytes_and_cleared_by_a_new_generation() {
        let mut h = Held::new(true, FIRST);
        let big = RawResponse {
            head: resp(type_url::CLUSTER, "c").head,
            bytes: Bytes::from(vec![0u8; MAX_HELD / 2 + 1]),
        };
        h.keep(big.clone()).unwrap();
        h.new_generation();
        h.keep(big.clone()).unwrap();
        assert!(h.keep(big).is_err());
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn sotw_follows_what_held_cds_names_until_envoy_takes_cds() {
        let mut h = Held::new(false, FIRST);
        let f = h
            .follow(type_url::CLUSTER, Update::Replace(names(&["a", "b"])))
            .unwrap();
        assert_eq!(
            (f.type_url, f.names.clone()),
            (type_url::ENDPOINT, names(&["a", "b"]))
        );
        assert!(h.holding());
        // The same names again: no new request.
        assert!(
            h.follow(type_url::CLUSTER, Update::Replace(names(&["b", "a"])))
                .is_none()
        );
        let f = h
            .follow(type_url::CLUSTER, Update::Replace(names(&["a", "c"])))
            .unwrap();
        assert_eq!(f.names, names(&["a", "c"]));
        h.keep(resp(type_url::ENDPOINT, "e1")).unwrap();
        assert_eq!(h.claim(type_url::CLUSTER, Some(&[])), Claim::Served);
        // Envoy has CDS: it asks for EDS itself from now on.
        assert!(
            h.follow(type_url::CLUSTER, Update::Replace(names(&["d"])))
                .is_none()
        );
        assert_eq!(
            h.claim(type_url::ENDPOINT, Some(&names(&["c", "a"]))),
            Claim::Served
        );
        h.take_ready();
        assert_eq!(h.claim(type_url::LISTENER, Some(&[])), Claim::Served);
        assert!(h.finished());
        // All names gone: EDS is let go (an empty SotW request is a wildcard).
        let mut h = Held::new(false, FIRST);
        h.follow(type_url::CLUSTER, Update::Replace(names(&["a"])));
        assert!(
            h.follow(type_url::CLUSTER, Update::Replace(vec![]))
                .is_none()
        );
        assert_eq!(h.claim(type_url::ENDPOINT, Some(&[])), Claim::Relay);
    }

    #[test]
    fn delta_follows_changes_and_a_nack_unsubscribes() {
        let mut h = Held::new(true, FIRST);
        let change = |up: &[(&str, &[&str])], removed: &[&str]| Update::Change {
            upserts: up
                .iter()
                .map(|(n, c)| ((*n).to_string(), names(c)))
                .collect(),
            removed: names(removed),
        };
        let f = h
            .follow(
                type_url::LISTENER,
                change(&[("l1", &["80"]), ("l2", &["80", "9080"])], &[]),
            )
            .unwrap();
        assert_eq!(
            (f.type_url, f.added.clone(), f.removed.clone()),
            (type_url::ROUTE, names(&["80", "9080"]), vec![])
        );
        let f = h.follow(type_url::LISTENER, change(&[], &["l2"])).unwrap();
        assert_eq!(
            (f.added.clone(), f.removed.clone()),
            (vec![], names(&["9080"]))
        );
        h.keep(resp(type_url::ROUTE, "r1")).unwrap();
        assert_eq!(h.claim(type_url::LISTENER, Some(&[])), Claim::Served);
        let f = h.rejected(type_url::LISTENER).unwrap();
        assert_eq!((f.type_url, f.removed), (type_url::ROUTE, names(&["80"])));
        assert_eq!(
            h.claim(type_url::ROUTE, Some(&names(&["80"]))),
            Claim::Relay
        );
        assert!(h.rejected(type_url::LISTENER).is_none());
    }

    #[test]
    fn node_and_flavor_from_a_bootstrap() {
        let doc = serde_json::json!({
            "node": {
                "id": "sidecar~10.0.0.1~app.ns~ns.svc.cluster.local",
                "cluster": "app.ns",
                "locality": { "region": "r", "zone": "z" },
                "metadata": { "NAMESPACE": "ns", "ISTIO_VERSION": "1.31", "LABELS": { "app": "a" }, "N": 2 }
            },
            "dynamic_resources": { "ads_config": { "api_type": "DELTA_GRPC" } }
        });
        let p = Prefetch::from_value(&doc).ok().unwrap();
        assert!(p.delta);
        assert_eq!(p.node.id, "sidecar~10.0.0.1~app.ns~ns.svc.cluster.local");
        assert_eq!(p.node.cluster, "app.ns");
        assert_eq!(p.node.locality.as_ref().unwrap().zone, "z");
        let meta = p.node.metadata.unwrap();
        assert_eq!(
            meta.fields["NAMESPACE"].kind,
            Some(Kind::StringValue("ns".into()))
        );
        assert!(matches!(
            meta.fields["LABELS"].kind,
            Some(Kind::StructValue(_))
        ));
        let mut sotw = doc.clone();
        sotw["dynamic_resources"]["ads_config"]["api_type"] = "GRPC".into();
        assert!(!Prefetch::from_value(&sotw).ok().unwrap().delta);
        let mut bad = doc.clone();
        bad["dynamic_resources"]["ads_config"]["api_type"] = "REST".into();
        assert!(matches!(Prefetch::from_value(&bad), Err(Err2::ApiType(_))));
        let mut no_node = doc;
        no_node.as_object_mut().unwrap().remove("node");
        assert!(matches!(
            Prefetch::from_value(&no_node),
            Err(Err2::Missing("node"))
        ));
    }

    #[test]
    fn a_bootstrap_that_is_not_there_or_not_a_document_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("envoy-rev.json");
        assert!(matches!(
            Prefetch::from_bootstrap(&path),
            Err(Error::Read { .. })
        ));
        std::fs::write(&path, "{ not: [ closed").unwrap();
        let e = Prefetch::from_bootstrap(&path).unwrap_err();
        assert!(matches!(e, Error::Parse { .. }), "{e}");
    }
}
