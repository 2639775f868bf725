//! Resources encoded once per generation, as they appear inside an ADS response, so that every
//! stream that sends them shares one copy of the bytes (`Bytes` slices) instead of cloning each
//! `Any` and encoding a whole response per proxy.
//!
//! A response goes out as one gRPC message in two parts: a small per-stream head (the gRPC
//! length prefix, then version, type URL, nonce and, for Delta, the removed names) and the
//! shared resource entries (field 2 of `DiscoveryResponse` / `DeltaDiscoveryResponse`).
//! Protobuf parsers accept fields in any order, so head and entries together are one valid
//! message: it decodes to exactly the response prost would have encoded.

use std::sync::Arc;

use prost::Message;
use prost::bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
use proto::envoy::service::discovery::v3::Resource as DeltaResource;

use super::Resources;

/// `resources` field number in both `DiscoveryResponse` and `DeltaDiscoveryResponse`.
const RESOURCES: u32 = 2;

/// One generation of resources of one type for one view, with their response entries.
pub struct Encoded {
    pub resources: Arc<Resources>,
    /// Each resource's name, shared: a Delta stream keys what it sent by these, so that it
    /// holds no copy of the names.
    pub names: Vec<Arc<str>>,
    /// Every SotW entry (field 2: the `Any`), concatenated in resource order.
    sotw: Bytes,
    /// End offset of each resource's entry in `sotw`.
    sotw_ends: Vec<usize>,
    /// Every Delta entry (field 2: a `Resource` with name, version and the `Any`).
    delta: Bytes,
    delta_ends: Vec<usize>,
}

impl std::fmt::Debug for Encoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoded")
            .field("resources", &self.resources.len())
            .field("sotw_bytes", &self.sotw.len())
            .field("delta_bytes", &self.delta.len())
            .finish()
    }
}

fn length_delimited(field: u32, msg: &impl Message, buf: &mut BytesMut) {
    encode_key(field, WireType::LengthDelimited, buf);
    encode_varint(msg.encoded_len() as u64, buf);
    msg.encode_raw(buf);
}

impl Encoded {
    /// Bytes it holds, counting the resources' own encoding (the `Any`s it was built from) once
    /// more: about what the cache keeps alive for it.
    pub fn size(&self) -> usize {
        let names: usize = self.names.iter().map(|n| n.len() + 16).sum();
        2 * self.sotw.len() + self.delta.len() + 16 * self.sotw_ends.len() + names
    }

    /// Encodes every resource's SotW and Delta entry once.
    pub fn new(resources: Arc<Resources>) -> Encoded {
        let mut sotw = BytesMut::new();
        let mut sotw_ends = Vec::with_capacity(resources.len());
        let mut delta = BytesMut::new();
        let mut delta_ends = Vec::with_capacity(resources.len());
        for r in resources.iter() {
            length_delimited(RESOURCES, &r.any, &mut sotw);
            sotw_ends.push(sotw.len());
            let entry = DeltaResource {
                name: r.name.clone(),
                version: format!("{:x}", r.hash),
                resource: Some(r.any.clone()),
                ..Default::default()
            };
            length_delimited(RESOURCES, &entry, &mut delta);
            delta_ends.push(delta.len());
        }
        Encoded {
            names: resources
                .iter()
                .map(|r| Arc::from(r.name.as_str()))
                .collect(),
            resources,
            sotw: sotw.freeze(),
            sotw_ends,
            delta: delta.freeze(),
            delta_ends,
        }
    }

    fn entry(all: &Bytes, ends: &[usize], i: usize) -> Bytes {
        let start = if i == 0 { 0 } else { ends[i - 1] };
        all.slice(start..ends[i])
    }

    /// The response body with the resources at `indices` (ascending) for SotW or Delta: the
    /// shared bytes themselves when that is every resource or one resource, else one copy of
    /// the selected entries.
    pub fn entries(&self, delta: bool, indices: &[usize]) -> Bytes {
        let (all, ends) = if delta {
            (&self.delta, &self.delta_ends)
        } else {
            (&self.sotw, &self.sotw_ends)
        };
        if indices.len() == ends.len() {
            return all.clone();
        }
        if let [i] = indices {
            return Self::entry(all, ends, *i);
        }
        let mut out = BytesMut::new();
        for &i in indices {
            out.extend_from_slice(&Self::entry(all, ends, i));
        }
        out.freeze()
    }
}

/// One ADS response ready for the wire (one gRPC message): `head` then `body`.
#[derive(Clone, Debug)]
pub struct Frame {
    pub head: Bytes,
    pub body: Bytes,
}

#[cfg(test)]
impl Frame {
    /// Both parts as one buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(self.head.len() + self.body.len());
        b.extend_from_slice(&self.head);
        b.extend_from_slice(&self.body);
        b.freeze()
    }
}

fn string_field(field: u32, s: &str, buf: &mut BytesMut) {
    // proto3: an empty string is not written (as prost does).
    if !s.is_empty() {
        put_string(field, s, buf);
    }
}

fn put_string(field: u32, s: &str, buf: &mut BytesMut) {
    encode_key(field, WireType::LengthDelimited, buf);
    encode_varint(s.len() as u64, buf);
    buf.put_slice(s.as_bytes());
}

fn string_len(field: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        prost::encoding::key_len(field) + encoded_len_varint(s.len() as u64) + s.len()
    }
}

fn frame(fields_len: usize, body: Bytes, write: impl FnOnce(&mut BytesMut)) -> Frame {
    let len = fields_len + body.len();
    let mut head = BytesMut::with_capacity(5 + fields_len);
    head.put_u8(0);
    head.put_u32(len as u32);
    write(&mut head);
    debug_assert_eq!(head.len(), 5 + fields_len);
    Frame {
        head: head.freeze(),
        body,
    }
}

/// A `DiscoveryResponse` (fields `version_info` 1, `type_url` 4, `nonce` 5) around `body`.
pub fn sotw_response(version: &str, type_url: &str, nonce: &str, body: Bytes) -> Frame {
    let fields = string_len(1, version) + string_len(4, type_url) + string_len(5, nonce);
    frame(fields, body, |b| {
        string_field(1, version, b);
        string_field(4, type_url, b);
        string_field(5, nonce, b);
    })
}

/// A `DeltaDiscoveryResponse` (`system_version_info` 1, `type_url` 4, `nonce` 5,
/// `removed_resources` 6) around `body`.
pub fn delta_response(
    version: &str,
    type_url: &str,
    nonce: &str,
    removed: &[String],
    body: Bytes,
) -> Frame {
    let fields = string_len(1, version)
        + string_len(4, type_url)
        + string_len(5, nonce)
        + removed
            .iter()
            .map(|r| prost::encoding::key_len(6) + encoded_len_varint(r.len() as u64) + r.len())
            .sum::<usize>();
    frame(fields, body, |b| {
        string_field(1, version, b);
        string_field(4, type_url, b);
        string_field(5, nonce, b);
        // Repeated strings are written even when empty.
        for r in removed {
            put_string(6, r, b);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::Resource;
    use proto::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use proto::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};

    fn resources() -> Arc<Resources> {
        Arc::new(
            ["a", "b", "c"]
                .iter()
                .map(|n| {
                    crate::xds::resource(
                        *n,
                        &ClusterLoadAssignment {
                            cluster_name: format!("cluster-{n}"),
                            ..Default::default()
                        },
                    )
                })
                .collect(),
        )
    }

    /// The message inside a frame, after checking its gRPC prefix.
    fn message(f: &Frame) -> Bytes {
        let all = f.to_bytes();
        assert_eq!(all[0], 0, "not compressed");
        let len = u32::from_be_bytes([all[1], all[2], all[3], all[4]]) as usize;
        assert_eq!(len, all.len() - 5, "prefix carries the message length");
        all.slice(5..)
    }

    fn pick(rs: &Resources, idx: &[usize]) -> Vec<Resource> {
        idx.iter().map(|i| rs[*i].clone()).collect()
    }

    #[test]
    fn sotw_frames_decode_to_the_response_prost_would_encode() {
        let enc = Encoded::new(resources());
        for idx in [vec![], vec![1], vec![0, 2], vec![0, 1, 2]] {
            let f = sotw_response(
                "v7",
                proto::type_url::ENDPOINT,
                "1f",
                enc.entries(false, &idx),
            );
            let got = DiscoveryResponse::decode(message(&f)).expect("decodes");
            let want = DiscoveryResponse {
                version_info: "v7".into(),
                resources: pick(&enc.resources, &idx)
                    .into_iter()
                    .map(|r| r.any)
                    .collect(),
                type_url: proto::type_url::ENDPOINT.into(),
                nonce: "1f".into(),
                ..Default::default()
            };
            assert_eq!(got, want, "indices {idx:?}");
        }
    }

    #[test]
    fn delta_frames_carry_names_versions_and_removals() {
        let enc = Encoded::new(resources());
        let removed = vec!["gone".to_string(), String::new()];
        let f = delta_response(
            "v8",
            proto::type_url::ENDPOINT,
            "20",
            &removed,
            enc.entries(true, &[0, 2]),
        );
        let got = DeltaDiscoveryResponse::decode(message(&f)).expect("decodes");
        let want = DeltaDiscoveryResponse {
            system_version_info: "v8".into(),
            resources: pick(&enc.resources, &[0, 2])
                .into_iter()
                .map(|r| DeltaResource {
                    name: r.name.clone(),
                    version: format!("{:x}", r.hash),
                    resource: Some(r.any),
                    ..Default::default()
                })
                .collect(),
            removed_resources: removed,
            type_url: proto::type_url::ENDPOINT.into(),
            nonce: "20".into(),
            ..Default::default()
        };
        assert_eq!(got, want);
    }

    #[test]
    fn every_or_one_resource_shares_the_generation_bytes() {
        let enc = Encoded::new(resources());
        let all = enc.entries(false, &[0, 1, 2]);
        assert_eq!(
            all.as_ptr(),
            enc.sotw.as_ptr(),
            "no copy for every resource"
        );
        let one = enc.entries(true, &[1]);
        assert_eq!(
            one.as_ptr(),
            enc.delta[enc.delta_ends[0]..].as_ptr(),
            "no copy for one"
        );
        let empty = sotw_response("", "", "", Bytes::new());
        assert_eq!(
            &empty.to_bytes()[..],
            &[0, 0, 0, 0, 0],
            "an empty message is a bare prefix"
        );
    }
}
