//! JSON (proto3 JSON mapping, as Envoy writes config dumps) → protobuf `Any`, through a
//! descriptor pool: envoy-types' own descriptor set (`descriptors/envoy-types.bin`, the file
//! envoy-types generated its Rust types from) plus the few messages in `protos/` it lacks.
//! Nested `Any`s are resolved against the same pool, so a type outside it is an error that
//! names its path.

use std::sync::OnceLock;

use prost::Message;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage};
use proto::google::protobuf::Any;
use serde_json::Value;

const ENVOY_TYPES: &[u8] = include_bytes!("../../descriptors/envoy-types.bin");
const EXTENSIONS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/replay-extensions.bin"));

fn build() -> Result<DescriptorPool, String> {
    let mut pool = DescriptorPool::decode(ENVOY_TYPES)
        .map_err(|e| format!("envoy-types descriptor set: {e}"))?;
    pool.decode_file_descriptor_set(EXTENSIONS)
        .map_err(|e| format!("replay extension descriptors: {e}"))?;
    Ok(pool)
}

/// The pool (decoded once).
pub(super) fn pool() -> Result<&'static DescriptorPool, String> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(build).as_ref().map_err(Clone::clone)
}

/// Encodes `json` as the message `type_url` names. Errors name the JSON path that failed.
pub(super) fn encode(type_url: &str, json: &Value) -> Result<Any, String> {
    let pool = pool()?;
    let name = type_url
        .strip_prefix(proto::type_url::PREFIX)
        .unwrap_or(type_url);
    let desc = pool
        .get_message_by_name(name)
        .ok_or_else(|| format!("type {name} is not known to istiod-lite"))?;
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(json, &mut track);
    let options = DeserializeOptions::new().deny_unknown_fields(true);
    let msg = DynamicMessage::deserialize_with_options(desc, de, &options).map_err(|e| {
        let at = track.path().to_string();
        if at.is_empty() || at == "." {
            e.to_string()
        } else {
            format!("at {at}: {e}")
        }
    })?;
    Ok(Any {
        type_url: type_url.to_string(),
        value: msg.encode_to_vec(),
    })
}
