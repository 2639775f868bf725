//! What Envoy (and the proxy itself) has subscribed to, kept so that a new upstream stream can be
//! told the same without Envoy noticing the old one ended: SotW, per type URL, the last request
//! (resource names, last ACKed version, no nonce); Delta, the subscribed names and the resource
//! versions Envoy ACKed (`initial_resource_versions`).
//!
//! Each upstream stream is a generation. Nonces are tracked per generation: an ACK or NACK Envoy
//! sends for a response of an earlier generation is not forwarded to the new stream (istiod did
//! not send that nonce); it only updates what is replayed, and when it also changes the
//! subscription it goes upstream as a fresh request (no nonce).

use std::collections::{HashMap, VecDeque};

use proto::envoy::config::core::v3::Node;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use proto::type_url;

use super::codec::RawResponse;

/// Nonces remembered per type and generation (Envoy answers responses in order, so the last few
/// are all it can still ACK).
const NONCES_PER_TYPE: usize = 16;

/// One flavor's subscription state.
pub(crate) trait Subscriptions: Default + Send + 'static {
    type Req;
    /// Records a request on its way upstream; `None` when it answers a response of an earlier
    /// generation and carries nothing new (it is not forwarded).
    fn on_request(&mut self, req: Self::Req) -> Option<Self::Req>;
    /// Records a response of the current generation before it is relayed.
    fn on_response(&mut self, resp: &RawResponse);
    /// Starts a new generation: the requests that open the new upstream stream.
    fn replay(&mut self) -> Vec<Self::Req>;
}

/// The nonces of responses relayed, per type URL: the current generation's and the earlier
/// generations' (the last [`NONCES_PER_TYPE`] of each type).
#[derive(Default)]
struct Nonces {
    current: HashMap<String, VecDeque<String>>,
    earlier: HashMap<String, VecDeque<String>>,
}

fn remember(seen: &mut VecDeque<String>, nonce: String) {
    if seen.len() == NONCES_PER_TYPE {
        seen.pop_front();
    }
    seen.push_back(nonce);
}

impl Nonces {
    fn record(&mut self, type_url: &str, nonce: &str) {
        remember(
            self.current.entry(type_url.to_string()).or_default(),
            nonce.to_string(),
        );
    }

    /// A nonce an earlier generation sent and the current one did not: the request answers a
    /// response of a stream that is gone. Nonces the proxy never saw pass (never judged).
    fn stale(&self, type_url: &str, nonce: &str) -> bool {
        let has = |m: &HashMap<String, VecDeque<String>>| {
            m.get(type_url)
                .is_some_and(|s| s.iter().any(|n| n == nonce))
        };
        !nonce.is_empty() && has(&self.earlier) && !has(&self.current)
    }

    /// The current generation becomes an earlier one.
    fn next_generation(&mut self) {
        for (type_url, nonces) in std::mem::take(&mut self.current) {
            let seen = self.earlier.entry(type_url).or_default();
            for n in nonces {
                remember(seen, n);
            }
        }
    }
}

/// SotW: the last request per type URL, in first-subscription order.
#[derive(Default)]
pub(crate) struct SotwSubscriptions {
    node: Option<Node>,
    types: Vec<DiscoveryRequest>,
    nonces: Nonces,
}

impl Subscriptions for SotwSubscriptions {
    type Req = DiscoveryRequest;

    fn on_request(&mut self, req: DiscoveryRequest) -> Option<DiscoveryRequest> {
        if self.node.is_none() && req.node.is_some() {
            self.node = req.node.clone();
        }
        let stale = self.nonces.stale(&req.type_url, &req.response_nonce);
        let index = self.types.iter().position(|r| r.type_url == req.type_url);
        let names_changed =
            index.is_none_or(|i| self.types[i].resource_names != req.resource_names);
        // Health reports are replayed as sent; everything else without nonce or error.
        let kept = if req.type_url == type_url::HEALTH_INFO {
            req.clone()
        } else {
            DiscoveryRequest {
                node: None,
                response_nonce: String::new(),
                error_detail: None,
                ..req.clone()
            }
        };
        match index {
            Some(i) => self.types[i] = kept,
            None => self.types.push(kept),
        }
        if !stale {
            return Some(req);
        }
        // An answer to an earlier generation: only a subscription change goes upstream.
        names_changed.then(|| DiscoveryRequest {
            response_nonce: String::new(),
            error_detail: None,
            ..req
        })
    }

    fn on_response(&mut self, resp: &RawResponse) {
        self.nonces.record(&resp.head.type_url, &resp.head.nonce);
    }

    fn replay(&mut self) -> Vec<DiscoveryRequest> {
        self.nonces.next_generation();
        let mut out = self.types.clone();
        if let Some(first) = out.first_mut() {
            first.node = self.node.clone();
        }
        out
    }
}

/// The names and versions of a Delta response's resources (the resources themselves skipped).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DeltaResources {
    #[prost(message, repeated, tag = "2")]
    pub(crate) resources: Vec<ResourceId>,
    #[prost(string, repeated, tag = "6")]
    pub(crate) removed_resources: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResourceId {
    #[prost(string, tag = "1")]
    pub(crate) version: String,
    #[prost(string, tag = "3")]
    pub(crate) name: String,
}

/// One Delta type: subscribed names and the versions Envoy holds.
#[derive(Default)]
struct DeltaType {
    type_url: String,
    subscribed: Vec<String>,
    versions: HashMap<String, String>,
    /// Health reports: the last one, replayed as sent.
    last: Option<DeltaDiscoveryRequest>,
}

/// Delta: per type URL, in first-subscription order.
#[derive(Default)]
pub(crate) struct DeltaSubscriptions {
    node: Option<Node>,
    types: Vec<DeltaType>,
    /// Relayed, not yet answered responses: nonce → (type URL, resources, removed names).
    pending: VecDeque<(String, String, DeltaResources)>,
    nonces: Nonces,
}

impl DeltaSubscriptions {
    fn entry(&mut self, type_url: &str) -> &mut DeltaType {
        let i = match self.types.iter().position(|t| t.type_url == type_url) {
            Some(i) => i,
            None => {
                self.types.push(DeltaType {
                    type_url: type_url.to_string(),
                    ..Default::default()
                });
                self.types.len() - 1
            }
        };
        &mut self.types[i]
    }
}

impl Subscriptions for DeltaSubscriptions {
    type Req = DeltaDiscoveryRequest;

    fn on_request(&mut self, req: DeltaDiscoveryRequest) -> Option<DeltaDiscoveryRequest> {
        if self.node.is_none() && req.node.is_some() {
            self.node = req.node.clone();
        }
        let stale = self.nonces.stale(&req.type_url, &req.response_nonce);
        // An ACK makes the answered response's versions Envoy's; a NACK leaves them.
        if !req.response_nonce.is_empty()
            && let Some(i) = self
                .pending
                .iter()
                .position(|(n, t, _)| *n == req.response_nonce && *t == req.type_url)
            && let Some((_, _, resources)) = self.pending.remove(i)
            && req.error_detail.is_none()
        {
            let t = self.entry(&req.type_url);
            for r in resources.resources {
                t.versions.insert(r.name, r.version);
            }
            for name in resources.removed_resources {
                t.versions.remove(&name);
            }
        }
        let t = self.entry(&req.type_url);
        if req.type_url == type_url::HEALTH_INFO {
            t.last = Some(req.clone());
        }
        t.versions.extend(req.initial_resource_versions.clone());
        for name in &req.resource_names_subscribe {
            if !t.subscribed.contains(name) {
                t.subscribed.push(name.clone());
            }
        }
        t.subscribed
            .retain(|n| !req.resource_names_unsubscribe.contains(n));
        for name in &req.resource_names_unsubscribe {
            t.versions.remove(name);
        }
        if !stale {
            return Some(req);
        }
        let changes =
            !req.resource_names_subscribe.is_empty() || !req.resource_names_unsubscribe.is_empty();
        changes.then(|| DeltaDiscoveryRequest {
            response_nonce: String::new(),
            error_detail: None,
            ..req
        })
    }

    fn on_response(&mut self, resp: &RawResponse) {
        self.nonces.record(&resp.head.type_url, &resp.head.nonce);
        // Only names and versions are read; a response that does not even parse as that is
        // not tracked (Envoy will NACK it).
        if let Ok(resources) = resp.decode::<DeltaResources>() {
            if self.pending.len() == NONCES_PER_TYPE * 4 {
                self.pending.pop_front();
            }
            self.pending.push_back((
                resp.head.nonce.clone(),
                resp.head.type_url.clone(),
                resources,
            ));
        }
    }

    fn replay(&mut self) -> Vec<DeltaDiscoveryRequest> {
        self.nonces.next_generation();
        self.pending.clear();
        let mut out: Vec<DeltaDiscoveryRequest> = self
            .types
            .iter()
            .map(|t| match &t.last {
                Some(last) => last.clone(),
                None => DeltaDiscoveryRequest {
                    type_url: t.type_url.clone(),
                    resource_names_subscribe: t.subscribed.clone(),
                    initial_resource_versions: t.versions.clone(),
                    ..Default::default()
                },
            })
            .collect();
        if let Some(first) = out.first_mut() {
            first.node = self.node.clone();
        }
        out
    }
}
