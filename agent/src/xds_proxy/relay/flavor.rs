//! What differs between SotW and Delta ADS for the relay: request and response types, the
//! proxy's own requests (NDS, PCDS, health, ECDS NACKs) and the ECDS Wasm rewrite.

use proto::envoy::config::core::v3::Node;
use proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use proto::envoy_types_crate::pb::google::protobuf::Any;
use proto::google::rpc::Status as RpcStatus;
use proto::type_url;

use super::super::codec::{Head, RawResponse};
use super::super::subscriptions::{DeltaSubscriptions, SotwSubscriptions, Subscriptions};
use super::super::wasm::ConvertError;
use crate::health::Health;

fn health_error(h: &Health) -> Option<RpcStatus> {
    match h {
        Health::Healthy => None,
        Health::Unhealthy(msg) => Some(nack_status(msg.clone())),
    }
}

/// What differs between SotW and Delta.
pub(crate) trait Flavor: Send + Sync + 'static {
    type Req: prost::Message + Clone + Default + Send + Sync + 'static;
    /// The full response message (decoded only for the proxy's own types, NDS and PCDS).
    type Resp: prost::Message + Default;
    /// What a new upstream stream replays.
    type Subs: Subscriptions<Req = Self::Req>;
    const NAME: &'static str;
    const DELTA: bool;
    /// The ADS method's gRPC path.
    const PATH: &'static str;
    fn req_type(r: &Self::Req) -> &str;
    /// A NACK's nonce and error detail (`None` for a request or an ACK).
    fn req_nack(r: &Self::Req) -> Option<(&str, &RpcStatus)>;
    /// The proxy's own initial request for `type_url` (NDS, PCDS; CDS and LDS, wildcard, on
    /// a warm stream).
    fn subscribe(type_url: &str) -> Self::Req;
    /// The warm stream, when it is of this flavor (else it is dropped, and so ends).
    fn warm(w: super::AnyWarm) -> Option<super::Warm<Self>>
    where
        Self: Sized;
    /// The warm stream's subscription for the type Envoy asks for next.
    fn follow(f: &super::warm::Follow) -> Self::Req;
    /// Puts the node on a stream's first request.
    fn set_node(r: &mut Self::Req, node: Node);
    /// A first request's resource names (no nonce, no error, nothing else asked); `None` for
    /// any other request.
    fn initial_names(r: &Self::Req) -> Option<Vec<String>>;
    /// The proxy's ACK (error `None`) or NACK for a response of its own type `type_url`.
    fn ack(type_url: &str, resp: &Head, error: Option<String>) -> Self::Req;
    /// Workload health for istiod: a request with `error_detail` when unhealthy.
    fn health(h: &Health) -> Self::Req;
    /// The first resource of a decoded response of the proxy's own types.
    /// `None`: nothing changed (a Delta response without resources, e.g. after a reconnect
    /// whose `initial_resource_versions` matched), so the value stays and is acked.
    fn first_resource(resp: &Self::Resp) -> Option<Option<&Any>>;
    /// The version an ACK (a request without error) carries; empty for Delta.
    fn req_version(r: &Self::Req) -> &str;
    /// The proxy's NACK of an ECDS response whose Wasm it could not convert, with the last
    /// version Envoy acknowledged.
    fn ecds_nack(resp: &Head, last_version: &str, error: String) -> Self::Req;
    /// Rewrites an ECDS response's remote Wasm ([`super::super::wasm`]).
    fn convert_wasm<'a>(
        bytes: &'a [u8],
        cache: &'a super::super::wasm::Cache,
    ) -> futures::future::BoxFuture<'a, Result<Option<bytes::Bytes>, ConvertError>>;
}

/// Why the proxy NACKs a response of its own types (NDS, PCDS).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnResponseError {
    #[error("malformed {what} response: {source}")]
    Malformed {
        what: &'static str,
        source: prost::DecodeError,
    },
    #[error(transparent)]
    Unpack(#[from] proto::UnpackError),
    #[error("{what} response without a resource")]
    NoResource { what: &'static str },
    /// The component it feeds refused it.
    #[error(transparent)]
    Rejected(super::super::SinkError),
}

/// The first resource of a response of the proxy's own types (`what`: NDS, PCDS), decoded
/// from the raw response.
pub(super) fn own_resource<F: Flavor, M: prost::Name + Default>(
    resp: &RawResponse,
    what: &'static str,
) -> Result<Option<M>, OwnResponseError> {
    let full = resp
        .decode::<F::Resp>()
        .map_err(|source| OwnResponseError::Malformed { what, source })?;
    match F::first_resource(&full) {
        Some(Some(any)) => Ok(Some(proto::unpack::<M>(any)?)),
        Some(None) => Err(OwnResponseError::NoResource { what }),
        None => Ok(None),
    }
}

/// State-of-the-world ADS.
pub(crate) struct Sotw;
/// Incremental ADS.
pub(crate) struct Delta;

pub(super) fn nack_status(error: String) -> RpcStatus {
    RpcStatus {
        code: tonic::Code::Internal as i32,
        message: error,
        details: vec![],
    }
}

impl Flavor for Sotw {
    type Req = DiscoveryRequest;
    type Resp = DiscoveryResponse;
    type Subs = SotwSubscriptions;
    const NAME: &'static str = "sotw";
    const DELTA: bool = false;
    const PATH: &'static str = super::super::SOTW_PATH;
    fn req_type(r: &DiscoveryRequest) -> &str {
        &r.type_url
    }
    fn req_nack(r: &DiscoveryRequest) -> Option<(&str, &RpcStatus)> {
        r.error_detail
            .as_ref()
            .map(|e| (r.response_nonce.as_str(), e))
    }
    fn subscribe(type_url: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url.into(),
            ..Default::default()
        }
    }
    fn warm(w: super::AnyWarm) -> Option<super::Warm<Self>> {
        match w {
            super::AnyWarm::Sotw(w) => Some(w),
            super::AnyWarm::Delta(_) => None,
        }
    }
    fn follow(f: &super::warm::Follow) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: f.type_url.into(),
            resource_names: f.names.clone(),
            ..Default::default()
        }
    }
    fn set_node(r: &mut DiscoveryRequest, node: Node) {
        r.node = Some(node);
    }
    fn initial_names(r: &DiscoveryRequest) -> Option<Vec<String>> {
        (r.response_nonce.is_empty() && r.error_detail.is_none() && r.version_info.is_empty())
            .then(|| r.resource_names.clone())
    }
    fn ack(type_url: &str, resp: &Head, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url.into(),
            version_info: resp.version_info.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: error.map(nack_status),
            ..Default::default()
        }
    }
    fn health(h: &Health) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url::HEALTH_INFO.into(),
            error_detail: health_error(h),
            ..Default::default()
        }
    }
    fn first_resource(resp: &DiscoveryResponse) -> Option<Option<&Any>> {
        Some(resp.resources.first())
    }
    fn req_version(r: &DiscoveryRequest) -> &str {
        &r.version_info
    }
    fn ecds_nack(resp: &Head, last_version: &str, error: String) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: last_version.into(),
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: Some(nack_status(error)),
            ..Default::default()
        }
    }
    fn convert_wasm<'a>(
        bytes: &'a [u8],
        cache: &'a super::super::wasm::Cache,
    ) -> futures::future::BoxFuture<'a, Result<Option<bytes::Bytes>, ConvertError>> {
        Box::pin(super::super::wasm::convert_sotw(bytes, cache))
    }
}

impl Flavor for Delta {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaDiscoveryResponse;
    type Subs = DeltaSubscriptions;
    const NAME: &'static str = "delta";
    const DELTA: bool = true;
    const PATH: &'static str = super::super::DELTA_PATH;
    fn req_type(r: &DeltaDiscoveryRequest) -> &str {
        &r.type_url
    }
    fn req_nack(r: &DeltaDiscoveryRequest) -> Option<(&str, &RpcStatus)> {
        r.error_detail
            .as_ref()
            .map(|e| (r.response_nonce.as_str(), e))
    }
    fn subscribe(type_url: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.into(),
            ..Default::default()
        }
    }
    fn warm(w: super::AnyWarm) -> Option<super::Warm<Self>> {
        match w {
            super::AnyWarm::Delta(w) => Some(w),
            super::AnyWarm::Sotw(_) => None,
        }
    }
    fn follow(f: &super::warm::Follow) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: f.type_url.into(),
            resource_names_subscribe: f.added.clone(),
            resource_names_unsubscribe: f.removed.clone(),
            ..Default::default()
        }
    }
    fn set_node(r: &mut DeltaDiscoveryRequest, node: Node) {
        r.node = Some(node);
    }
    fn initial_names(r: &DeltaDiscoveryRequest) -> Option<Vec<String>> {
        (r.response_nonce.is_empty()
            && r.error_detail.is_none()
            && r.resource_names_unsubscribe.is_empty()
            && r.initial_resource_versions.is_empty())
        .then(|| r.resource_names_subscribe.clone())
    }
    fn ack(type_url: &str, resp: &Head, error: Option<String>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.into(),
            response_nonce: resp.nonce.clone(),
            error_detail: error.map(nack_status),
            ..Default::default()
        }
    }
    fn health(h: &Health) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url::HEALTH_INFO.into(),
            error_detail: health_error(h),
            ..Default::default()
        }
    }
    fn first_resource(resp: &DeltaDiscoveryResponse) -> Option<Option<&Any>> {
        if resp.resources.is_empty() && resp.removed_resources.is_empty() {
            return None;
        }
        Some(resp.resources.first().and_then(|r| r.resource.as_ref()))
    }
    fn req_version(_: &DeltaDiscoveryRequest) -> &str {
        ""
    }
    fn ecds_nack(resp: &Head, _: &str, error: String) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: Some(nack_status(error)),
            ..Default::default()
        }
    }
    fn convert_wasm<'a>(
        bytes: &'a [u8],
        cache: &'a super::super::wasm::Cache,
    ) -> futures::future::BoxFuture<'a, Result<Option<bytes::Bytes>, ConvertError>> {
        Box::pin(super::super::wasm::convert_delta(bytes, cache))
    }
}
