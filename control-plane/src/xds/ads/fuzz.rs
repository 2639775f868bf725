//! The fuzz target's entry point (`fuzz/fuzz_targets/ads_request.rs`): request bytes through the
//! stream task the server runs for every ADS stream ([`Conn::run`]): prost's decode of each
//! request, node parsing, authorization, resource names, nonces, ACK/NACK bookkeeping and the
//! pushes they cause, against a small snapshot (a ServiceEntry with endpoints, a VirtualService).

use std::sync::{Arc, OnceLock};

use prometheus_client::registry::Registry;
use prost::Message;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::{AdsInputs, AdsServer, Req, ReqStream, Wire, XdsMetrics};
use crate::ca::Identity;
use crate::config::{Config, parse_file};
use crate::model::{MeshSettings, Snapshot};
use crate::xds::SyncTable;

const CONFIG: &str = r#"
kind: ServiceEntry
metadata: {name: api, namespace: ns}
spec:
  hosts: [api.example.com]
  ports: [{number: 80, name: http, protocol: HTTP}, {number: 443, name: tls, protocol: TLS}]
  resolution: STATIC
  endpoints: [{address: 198.18.0.10}, {address: 198.18.0.11}]
---
kind: VirtualService
metadata: {name: api, namespace: ns}
spec:
  hosts: [api.example.com]
  http: [{route: [{destination: {host: api.example.com}}]}]
"#;

/// Responses a run may produce at most: a stream answers each request with at most one push per
/// type, so this bounds what one input can make the server send.
const MAX_RESPONSES: usize = 4096;

struct World {
    ads: AdsServer,
    runtime: tokio::runtime::Runtime,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let objects = parse_file("fuzz.yaml", CONFIG).expect("the fuzz config parses");
        let snap = Snapshot::new(
            Arc::new(Config::from_objects(objects)),
            Arc::new(MeshSettings::default()),
            1,
        );
        let (tx, rx) = watch::channel(Arc::new(snap));
        // The sender lives as long as the server: streams end only when their requests do.
        std::mem::forget(tx);
        let ads = AdsServer::new(AdsInputs {
            snapshots: rx,
            fixed: None,
            push_throttle: 1,
            metrics: XdsMetrics::new(&mut Registry::default()),
            sync: SyncTable::default(),
            cancel: CancellationToken::new(),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        World { ads, runtime }
    })
}

/// Splits `data` into requests: each a 2-byte little-endian length and that many bytes.
fn frames(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while let [lo, hi, rest @ ..] = data {
        let n = usize::from(u16::from_le_bytes([*lo, *hi])).min(rest.len());
        out.push(&rest[..n]);
        data = &rest[n..];
    }
    out
}

/// One stream: the first byte picks SotW or Delta (bit 0) and whether the stream was
/// authenticated (bit 1: as `ns/sa`, or bit 2: as `other/sa`); the rest is framed requests
/// (`frames`), each decoded as the server decodes it (an undecodable one ends the stream
/// `INTERNAL`, as on the wire). Never panics; the stream ends when its requests do, and it
/// sends no more than `MAX_RESPONSES` responses.
pub fn fuzz_ads_requests(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let delta = mode & 1 != 0;
    let identity = match mode & 6 {
        2 => Some(Identity::new("cluster.local", "ns", "sa")),
        4 => Some(Identity::new("cluster.local", "other", "sa")),
        _ => None,
    };
    let requests: Vec<Result<Req, Status>> = frames(rest)
        .into_iter()
        .map(|bytes| {
            let decoded = if delta {
                DeltaDiscoveryRequest::decode(bytes).map(Req::from)
            } else {
                DiscoveryRequest::decode(bytes).map(Req::from)
            };
            decoded.map_err(|e| Status::internal(format!("cannot decode the ADS request: {e}")))
        })
        .collect();
    let world = world();
    world.runtime.block_on(async {
        let (out, mut rx) = mpsc::channel(16);
        let stream: ReqStream = Box::pin(futures::stream::iter(requests));
        let task = world.ads.conn(out, delta, identity).run(stream);
        let drain = async {
            let mut n = 0usize;
            while let Some(wire) = rx.recv().await {
                n += 1;
                assert!(
                    n <= MAX_RESPONSES,
                    "one stream sent over {MAX_RESPONSES} responses"
                );
                if let Wire::End(status) = wire {
                    assert_ne!(
                        status.code(),
                        tonic::Code::Ok,
                        "a stream ends with a reason"
                    );
                }
            }
        };
        tokio::join!(task, drain);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::envoy::config::core::v3::Node;

    fn framed(delta_and_auth: u8, requests: &[Vec<u8>]) -> Vec<u8> {
        let mut out = vec![delta_and_auth];
        for r in requests {
            out.extend_from_slice(&(r.len() as u16).to_le_bytes());
            out.extend_from_slice(r);
        }
        out
    }

    #[test]
    fn samples_run_to_the_end() {
        let node = Some(Node {
            id: "sidecar~198.18.0.1~a.ns~ns.svc.cluster.local".into(),
            ..Default::default()
        });
        let sotw = |type_url: &str, nonce: &str, names: &[&str]| {
            DiscoveryRequest {
                node: node.clone(),
                type_url: type_url.into(),
                response_nonce: nonce.into(),
                resource_names: names.iter().map(|n| n.to_string()).collect(),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let stream = [
            sotw(proto::type_url::CLUSTER, "", &[]),
            sotw(proto::type_url::CLUSTER, "1", &[]),
            sotw(
                proto::type_url::ENDPOINT,
                "",
                &["outbound|80||api.example.com", "x"],
            ),
            sotw(proto::type_url::ENDPOINT, "2", &["nope"]),
            sotw("type.googleapis.com/unknown", "", &["*"]),
            b"\xff\xff".to_vec(),
        ];
        for mode in 0..8 {
            fuzz_ads_requests(&framed(mode, &stream));
        }
        fuzz_ads_requests(&[]);
        fuzz_ads_requests(&[1, 200]);
    }
}
