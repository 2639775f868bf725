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

/// Why a resource cannot be encoded.
#[derive(Debug, thiserror::Error)]
pub(super) enum Error {
    #[error("envoy-types descriptor set: {0}")]
    EnvoyTypes(#[source] prost_reflect::DescriptorError),
    #[error("replay extension descriptors: {0}")]
    Extensions(#[source] prost_reflect::DescriptorError),
    /// The pool failed to build (once, for every resource).
    #[error(transparent)]
    Pool(&'static Error),
    #[error("type {0} is not known to istiod-lite")]
    UnknownType(String),
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    #[error("at {at}: {source}")]
    JsonAt {
        at: String,
        #[source]
        source: serde_json::Error,
    },
}

fn build() -> Result<DescriptorPool, Error> {
    let mut pool = DescriptorPool::decode(ENVOY_TYPES).map_err(Error::EnvoyTypes)?;
    pool.decode_file_descriptor_set(EXTENSIONS)
        .map_err(Error::Extensions)?;
    Ok(pool)
}

/// The pool (decoded once).
pub(super) fn pool() -> Result<&'static DescriptorPool, Error> {
    static POOL: OnceLock<Result<DescriptorPool, Error>> = OnceLock::new();
    POOL.get_or_init(build).as_ref().map_err(Error::Pool)
}

/// Encodes `json` as the message `type_url` names. Errors name the JSON path that failed.
pub(super) fn encode(type_url: &str, json: &Value) -> Result<Any, Error> {
    let pool = pool()?;
    let name = type_url
        .strip_prefix(proto::type_url::PREFIX)
        .unwrap_or(type_url);
    let desc = pool
        .get_message_by_name(name)
        .ok_or_else(|| Error::UnknownType(name.to_string()))?;
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(json, &mut track);
    let options = DeserializeOptions::new().deny_unknown_fields(true);
    let msg = DynamicMessage::deserialize_with_options(desc, de, &options).map_err(|source| {
        let at = track.path().to_string();
        if at.is_empty() || at == "." {
            Error::Json(source)
        } else {
            Error::JsonAt { at, source }
        }
    })?;
    Ok(Any {
        type_url: type_url.to_string(),
        value: msg.encode_to_vec(),
    })
}
