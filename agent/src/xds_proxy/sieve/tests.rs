use prost::Message;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse, Resource};
use proto::envoy_types_crate::pb::google::protobuf::Any;
use proto::type_url;

use super::*;

fn sotw(n: usize) -> Vec<u8> {
    DiscoveryResponse {
        version_info: "2026-12-01T22:00:00Z/7".into(),
        type_url: type_url::CLUSTER.into(),
        nonce: "nonce-7".into(),
        canary: true,
        resources: (0..n)
            .map(|i| Any {
                type_url: type_url::CLUSTER.into(),
                value: format!("outbound|80||svc-{i}.demo.svc.cluster.local").into_bytes(),
            })
            .collect(),
        ..Default::default()
    }
    .encode_to_vec()
}

fn delta(n: usize) -> Vec<u8> {
    DeltaDiscoveryResponse {
        system_version_info: "sys-3".into(),
        type_url: type_url::CLUSTER.into(),
        nonce: "d-3".into(),
        removed_resources: vec!["gone-1".into(), "gone-2".into()],
        resources: (0..n)
            .map(|i| Resource {
                name: format!("svc-{i}"),
                version: format!("v{i}"),
                aliases: vec![format!("alias-{i}")],
                resource: Some(Any {
                    type_url: type_url::CLUSTER.into(),
                    value: vec![b'c'; 40 + i % 7],
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
    .encode_to_vec()
}

/// Cut points: every offset (each byte its own chunk) and a few irregular splits.
fn cut_sets(len: usize) -> Vec<Vec<usize>> {
    vec![
        vec![],
        (1..len).collect(),
        (0..len).step_by(7).collect(),
        (0..len).step_by(4096).collect(),
        vec![1, 2, 3, len / 2, len - 1],
    ]
}

#[test]
fn sieved_fields_are_prosts_in_any_chunking() {
    for (bytes, delta) in [
        (sotw(0), false),
        (sotw(300), false),
        (delta(0), true),
        (delta(300), true),
    ] {
        for cuts in cut_sets(bytes.len()) {
            assert_eq!(
                check_against_prost(&bytes, delta, &cuts),
                Ok(true),
                "delta={delta} len={} cuts={}",
                bytes.len(),
                cuts.len()
            );
        }
    }
}

#[test]
fn resources_are_not_kept() {
    let bytes = sotw(2000);
    let mut sieve = Sieve::new(bytes.len() as u64, false);
    sieve.feed(&bytes).unwrap();
    let kept = sieve.finish().unwrap();
    // The head: two short strings and the type URL.
    assert!(
        kept.len() < 120,
        "kept {} of {} bytes",
        kept.len(),
        bytes.len()
    );
    let bytes = delta(2000);
    let mut sieve = Sieve::new(bytes.len() as u64, true);
    sieve.feed(&bytes).unwrap();
    let kept = sieve.finish().unwrap();
    // Names and versions only: under a fifth of the message.
    assert!(
        kept.len() * 5 < bytes.len(),
        "kept {} of {} bytes",
        kept.len(),
        bytes.len()
    );
}

#[test]
fn malformed_messages_fail_as_they_do_in_prost() {
    let mut truncated = sotw(3);
    truncated.truncate(truncated.len() - 3);
    // A string field declared as a varint, a key of field 0, wire type 7, an end group with
    // no group open, an unterminated group, a ten-byte varint over 64 bits.
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", truncated),
        ("type_url as varint", vec![0x20, 0x01]),
        ("field 0", vec![0x02, 0x00]),
        ("wire type 7", vec![0x0f]),
        ("stray end group", vec![0x3c]),
        ("unterminated group", vec![0x3b, 0x08, 0x01]),
        (
            "long varint",
            [0x38].into_iter().chain([0xff; 9]).chain([0x02]).collect(),
        ),
        ("length past the end", vec![0x0a, 0x05, b'a']),
    ];
    for (what, bytes) in cases {
        for delta in [false, true] {
            for cuts in cut_sets(bytes.len().max(2)) {
                assert_eq!(
                    check_against_prost(&bytes, delta, &cuts),
                    Ok(false),
                    "{what} (delta={delta}) should be rejected by both"
                );
            }
        }
    }
}

#[test]
fn groups_are_skipped_as_prost_skips_them() {
    // Field 9 as a group holding a varint, a nested group and a string; then the nonce.
    let mut bytes = vec![0x4b, 0x08, 0x01, 0x53, 0x12, 0x01, b'x', 0x54, 0x4c];
    bytes.extend_from_slice(&[0x2a, 0x02, b'n', b'1']);
    for delta in [false, true] {
        for cuts in cut_sets(bytes.len()) {
            assert_eq!(check_against_prost(&bytes, delta, &cuts), Ok(true));
        }
    }
    // A group ended with another field's number.
    assert_eq!(check_against_prost(&[0x4b, 0x54], false, &[]), Ok(false));
}

#[test]
fn nesting_limit_is_prosts() {
    // Groups nested `depth` deep at the top and inside a Delta resource: prost gives up at its
    // recursion limit, and so must the sieve, exactly there.
    for depth in [98, 99, 100, 101] {
        let mut groups = vec![0x4b; depth];
        groups.extend(std::iter::repeat_n(0x4c, depth));
        assert!(
            check_against_prost(&groups, false, &[]).is_ok(),
            "top, {depth}"
        );
        let mut resource = vec![0x12];
        prost::encoding::encode_varint(groups.len() as u64, &mut resource);
        resource.extend_from_slice(&groups);
        let got = check_against_prost(&resource, true, &[3]);
        assert!(got.is_ok(), "resource, {depth}: {got:?}");
    }
}

#[test]
fn first_resource_type_needs_the_whole_first_resource() {
    let bytes = sotw(10);
    assert_eq!(
        first_resource_type(&bytes, false).as_deref(),
        Some(type_url::CLUSTER)
    );
    let bytes = delta(10);
    assert_eq!(
        first_resource_type(&bytes, true).as_deref(),
        Some(type_url::CLUSTER)
    );
    // Only the version: no resource yet.
    assert_eq!(first_resource_type(&bytes[..8], true), None);
    // The first resource cut short.
    let one = DiscoveryResponse {
        resources: vec![Any {
            type_url: type_url::CLUSTER.into(),
            value: vec![1; 30],
        }],
        ..Default::default()
    }
    .encode_to_vec();
    assert_eq!(
        first_resource_type(&one, false).as_deref(),
        Some(type_url::CLUSTER)
    );
    assert_eq!(first_resource_type(&one[..one.len() - 2], false), None);
    assert_eq!(first_resource_type(&[], false), None);
    assert_eq!(first_resource_type(&[0xff], false), None);
}
