//! xDS and NDS from the wire into our types: `DiscoveryResponse` / `DeltaDiscoveryResponse` /
//! `NameTable` decoding and `proto::unpack` of every resource into the type its URL names; and the
//! agent's xDS proxy header codec (`version_info`/`type_url`/`nonce` only), which must never panic
//! and must agree with prost's full decode whenever that succeeds; the proxy's streaming sieve,
//! fed the bytes in input-chosen chunks, which must read what prost reads and reject what prost
//! rejects; and its response framer, which must only ever send Envoy a prefix of istiod's bytes.
#![no_main]

use prost::Message;
use proto::envoy::config::cluster::v3::Cluster;
use proto::envoy::config::endpoint::v3::ClusterLoadAssignment;
use proto::envoy::config::listener::v3::Listener;
use proto::envoy::config::route::v3::RouteConfiguration;
use proto::envoy::extensions::transport_sockets::tls::v3::Secret;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use proto::google::protobuf::Any;
use proto::istio::nds::NameTable;

fn unpack_any(any: &Any) {
    match any.type_url.as_str() {
        proto::type_url::NAME_TABLE => {
            if let Ok(nt) = proto::unpack::<NameTable>(any) {
                // Re-encoding what was decoded must round-trip.
                let again = NameTable::decode(nt.encode_to_vec().as_slice()).expect("round trip");
                assert_eq!(again, nt);
            }
        }
        proto::type_url::LISTENER => drop(proto::unpack::<Listener>(any)),
        proto::type_url::CLUSTER => drop(proto::unpack::<Cluster>(any)),
        proto::type_url::ROUTE => drop(proto::unpack::<RouteConfiguration>(any)),
        proto::type_url::ENDPOINT => drop(proto::unpack::<ClusterLoadAssignment>(any)),
        proto::type_url::SECRET => drop(proto::unpack::<Secret>(any)),
        // A wrong type URL must be an error, not a misparse.
        _ => assert!(proto::unpack::<NameTable>(any).is_err()),
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let head = agent::fuzzing::decode_response_head(data);
    if let Ok(resp) = DiscoveryResponse::decode(data) {
        let head = head
            .as_ref()
            .expect("full decode succeeded, header decode failed");
        assert_eq!(head.version_info, resp.version_info);
        assert_eq!(head.type_url, resp.type_url);
        assert_eq!(head.nonce, resp.nonce);
        for any in &resp.resources {
            unpack_any(any);
        }
    }
    if let Ok(resp) = DeltaDiscoveryResponse::decode(data) {
        let head = head
            .as_ref()
            .expect("full delta decode succeeded, header decode failed");
        assert_eq!(head.version_info, resp.system_version_info);
        assert_eq!(head.type_url, resp.type_url);
        assert_eq!(head.nonce, resp.nonce);
        for r in &resp.resources {
            if let Some(any) = &r.resource {
                unpack_any(any);
            }
        }
    }
    let _ = NameTable::decode(data);

    // Chunk boundaries from the input's first bytes; both message kinds.
    let cuts: Vec<usize> = data.iter().take(8).map(|&b| b as usize * 7 % (data.len() + 1)).collect();
    for delta in [false, true] {
        if let Err(e) = agent::fuzzing::check_against_prost(data, delta, &cuts) {
            panic!("sieve and prost disagree (delta={delta}): {e}");
        }
    }
    // The input as istiod's byte stream: gRPC-framed responses, in frames of 1..=64 bytes,
    // holding up to 32 bytes.
    let frame = data.first().map_or(1, |&b| usize::from(b % 64) + 1);
    for delta in [false, true] {
        let (sent, _) = agent::fuzzing::relay_frames(data, delta, 32, frame);
        assert!(data.starts_with(&sent), "the framer sent Envoy bytes istiod did not send");
    }
});
