use prost::Message;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse, Resource};
use proto::envoy_types_crate::pb::google::protobuf::Any;
use proto::type_url;

use super::*;

fn sotw(t: &str, n: usize, nonce: &str) -> Vec<u8> {
    DiscoveryResponse {
        version_info: format!("v-{nonce}"),
        type_url: t.into(),
        nonce: nonce.into(),
        resources: (0..n)
            .map(|i| Any {
                type_url: t.into(),
                value: vec![(i % 251) as u8; 100],
            })
            .collect(),
        ..Default::default()
    }
    .encode_to_vec()
}

fn framed(msgs: &[&[u8]]) -> Vec<u8> {
    let mut wire = Vec::new();
    for m in msgs {
        wire.push(0);
        wire.extend_from_slice(&(m.len() as u32).to_be_bytes());
        wire.extend_from_slice(m);
    }
    wire
}

/// Feeds `wire` in frames of `frame` bytes.
fn pieces(framer: &mut Framer, wire: &[u8], frame: usize) -> Result<Vec<Piece>, Status> {
    let mut out = VecDeque::new();
    for chunk in wire.chunks(frame) {
        framer.push(Bytes::copy_from_slice(chunk), &mut out)?;
    }
    Ok(out.into())
}

/// What Envoy gets from a sequence of pieces: whole messages framed, parts as they are.
fn downstream(pieces: &[Piece]) -> Vec<u8> {
    let mut wire = Vec::new();
    for p in pieces {
        match p {
            Piece::Whole(r) => wire.extend_from_slice(&framed(&[r.bytes()])),
            Piece::Part(b) | Piece::Last(b, _) => wire.extend_from_slice(b),
        }
    }
    wire
}

#[test]
fn small_responses_are_held_whole_in_any_framing() {
    let a = sotw(type_url::CLUSTER, 3, "a");
    let b = sotw(type_url::LISTENER, 0, "b");
    let wire = framed(&[&a, &b, &[]]);
    for frame in [1, 2, 5, 6, 17, wire.len()] {
        let mut framer = Framer::new(HOLD, false);
        let got = pieces(&mut framer, &wire, frame).unwrap();
        assert_eq!(got.len(), 3, "frame {frame}");
        assert!(got.iter().all(|p| matches!(p, Piece::Whole(_))));
        assert_eq!(downstream(&got), wire);
        let Piece::Whole(first) = &got[0] else {
            unreachable!()
        };
        assert_eq!(
            (first.type_url(), first.head.nonce.as_str()),
            (type_url::CLUSTER, "a")
        );
        assert!(framer.at_boundary() && !framer.relaying());
    }
}

#[test]
fn a_long_response_for_envoy_is_relayed_as_it_arrives() {
    let hold = 4096;
    let big = sotw(type_url::CLUSTER, 500, "big");
    let small = sotw(type_url::ENDPOINT, 1, "small");
    let wire = framed(&[&big, &small]);
    for frame in [1000, 16384, 3] {
        let mut framer = Framer::new(hold, false);
        let mut out = VecDeque::new();
        let mut seen_parts = 0;
        for chunk in wire.chunks(frame) {
            framer
                .push(Bytes::copy_from_slice(chunk), &mut out)
                .unwrap();
            // Parts come out before the response is complete.
            seen_parts = seen_parts.max(out.iter().filter(|p| matches!(p, Piece::Part(_))).count());
        }
        let got: Vec<Piece> = out.into();
        assert!(
            matches!(&got[0], Piece::Part(h) if h.len() == 5),
            "the gRPC header first"
        );
        let last = got
            .iter()
            .position(|p| matches!(p, Piece::Last(..)))
            .unwrap();
        let Piece::Last(_, head) = &got[last] else {
            unreachable!()
        };
        assert_eq!(head.type_url(), type_url::CLUSTER);
        assert_eq!(head.head.nonce, "big");
        assert_eq!(head.head.version_info, "v-big");
        assert!(head.bytes().len() < 100, "the resources are not kept");
        assert!(matches!(&got[last + 1], Piece::Whole(r) if r.head.nonce == "small"));
        assert_eq!(downstream(&got), wire, "Envoy gets the bytes istiod sent");
        assert!(seen_parts >= 2);
    }
}

#[test]
fn relaying_is_true_only_inside_a_relayed_response() {
    let big = sotw(type_url::CLUSTER, 100, "big");
    let wire = framed(&[&big]);
    let mut framer = Framer::new(1024, false);
    let mut out = VecDeque::new();
    framer
        .push(Bytes::copy_from_slice(&wire[..500]), &mut out)
        .unwrap();
    assert!(
        !framer.relaying() && !framer.at_boundary(),
        "still held: Envoy has nothing"
    );
    framer
        .push(Bytes::copy_from_slice(&wire[500..2000]), &mut out)
        .unwrap();
    assert!(
        framer.relaying(),
        "past the hold limit: Envoy has part of it"
    );
    framer
        .push(Bytes::copy_from_slice(&wire[2000..]), &mut out)
        .unwrap();
    assert!(!framer.relaying() && framer.at_boundary());
}

#[test]
fn long_responses_not_for_envoy_are_held_whole() {
    // NDS is the proxy's own; an unknown type is dropped by the relay: both need the whole.
    for t in [type_url::NAME_TABLE, "type.googleapis.com/example.Unknown"] {
        let big = sotw(t, 200, "nds");
        let wire = framed(&[&big]);
        let mut framer = Framer::new(1024, false);
        let got = pieces(&mut framer, &wire, 700).unwrap();
        assert_eq!(got.len(), 1, "{t}");
        assert!(matches!(&got[0], Piece::Whole(r) if r.bytes()[..] == big[..]));
    }
    // A first resource longer than the hold limit: its type is unknown, so held.
    let huge = sotw(type_url::CLUSTER, 1, "one");
    let mut framer = Framer::new(50, false);
    let got = pieces(&mut framer, &framed(&[&huge]), 30).unwrap();
    assert!(matches!(&got[..], [Piece::Whole(_)]));
}

#[test]
fn delta_responses_keep_names_and_versions() {
    let big = DeltaDiscoveryResponse {
        type_url: type_url::CLUSTER.into(),
        nonce: "d1".into(),
        removed_resources: vec!["old".into()],
        resources: (0..300)
            .map(|i| Resource {
                name: format!("c{i}"),
                version: format!("v{i}"),
                resource: Some(Any {
                    type_url: type_url::CLUSTER.into(),
                    value: vec![7; 64],
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
    .encode_to_vec();
    let mut framer = Framer::new(2048, true);
    let got = pieces(&mut framer, &framed(&[&big]), 1000).unwrap();
    let Some(Piece::Last(_, resp)) = got.last() else {
        panic!("relayed in parts")
    };
    let ids: crate::xds_proxy::subscriptions::DeltaResources = resp.decode().unwrap();
    assert_eq!(ids.resources.len(), 300);
    assert_eq!(
        (
            ids.resources[299].name.as_str(),
            ids.resources[299].version.as_str()
        ),
        ("c299", "v299")
    );
    assert_eq!(ids.removed_resources, ["old"]);
}

#[test]
fn bad_frames_are_errors() {
    let mut framer = Framer::new(HOLD, false);
    let err = pieces(&mut framer, &[1, 0, 0, 0, 1, 0], 6).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal);
    assert!(err.message().contains("compressed"), "{}", err.message());
    let mut framer = Framer::new(HOLD, false);
    assert!(pieces(&mut framer, &[7, 0, 0, 0, 0], 5).is_err());
    // A relayed response whose bytes turn out malformed: an INTERNAL error, not a panic.
    let mut bad = sotw(type_url::CLUSTER, 50, "x");
    bad.extend_from_slice(&[0x20, 0x01]);
    let mut framer = Framer::new(1024, false);
    assert_eq!(
        pieces(&mut framer, &framed(&[&bad]), 512)
            .unwrap_err()
            .code(),
        tonic::Code::Internal
    );
}
