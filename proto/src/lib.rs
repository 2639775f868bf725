//! Every protocol the mesh speaks, in one crate so that the large generated code compiles once.
//!
//! - [`envoy`]: Envoy's v3 API (xDS, SDS, resource types), re-exported from `envoy-types`.
//! - [`istio::ca`]: `istio.v1.auth.IstioCertificateService` (CSR signing).
//! - [`istio::nds`]: `istio.networking.nds.v1.NameTable` (the DNS proxy's name table).
//! - [`perftools::profiles`]: pprof's profile format (the agent's `/debug/pprof/profile`).
//! - [`type_url`]: the type URLs the agent and control plane dispatch on.
//!
//! And the plumbing both binaries share: [`listen`] (the accept loop), [`uds`] (Unix sockets)
//! and [`lifecycle`] (shutdown, readiness and the supervisor of long-running components).
//!
//! Well-known protobuf types (`Any`, `Struct`, `Duration`) are envoy-types' own; the Istio
//! protos are compiled against them, so no conversion is needed anywhere.

// unsafe only where a function allows it: the open-file rlimit (listen.rs).
#![deny(unsafe_code)]

pub mod lifecycle;
pub mod listen;
pub mod uds;

pub use lifecycle::{Components, DrainMode, Readiness, ReadyGuard, Shutdown};

pub use envoy_types as envoy_types_crate;
pub use envoy_types::pb::envoy;
pub use envoy_types::pb::google;

/// Istio's own protocols.
#[allow(unused_qualifications)] // generated code (tonic-prost-build) spells full paths
pub mod istio {
    /// `istio.v1.auth`: the CA service.
    pub mod ca {
        tonic::include_proto!("istio.v1.auth");
    }
    /// `istio.networking.nds.v1`: the name table.
    pub mod nds {
        tonic::include_proto!("istio.networking.nds.v1");
    }
    /// `istio.mesh.v1alpha1`: what the agent reads of `ProxyConfig` over PCDS.
    pub mod mesh {
        /// The part of `istio.mesh.v1alpha1.ProxyConfig` the agent takes from PCDS: the extra
        /// trust anchors `caCertificatesPem` (field 34). Other fields are skipped on decode;
        /// encoded, it is a `ProxyConfig` carrying only them.
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct ProxyConfigTrust {
            #[prost(string, repeated, tag = "34")]
            pub ca_certificates_pem: Vec<String>,
        }

        impl prost::Name for ProxyConfigTrust {
            const NAME: &'static str = "ProxyConfig";
            const PACKAGE: &'static str = "istio.mesh.v1alpha1";
            fn full_name() -> String {
                "istio.mesh.v1alpha1.ProxyConfig".into()
            }
            fn type_url() -> String {
                crate::type_url::PROXY_CONFIG.into()
            }
        }
    }
}

/// pprof's profile format (`perftools.profiles.Profile`, google/pprof's `proto/profile.proto`):
/// what `go tool pprof` reads, gzip-compressed.
pub mod perftools {
    pub mod profiles {
        tonic::include_proto!("perftools.profiles");
    }
}

/// Type URLs used on ADS and SDS streams.
pub mod type_url {
    pub const PREFIX: &str = "type.googleapis.com/";
    pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
    pub const NAME_TABLE: &str = "type.googleapis.com/istio.networking.nds.v1.NameTable";
    pub const PROXY_CONFIG: &str = "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig";
    pub const HEALTH_INFO: &str = "type.googleapis.com/istio.v1.HealthInformation";
    pub const ECDS: &str = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
}

use envoy_types::pb::google::protobuf::Any;

/// Packs a message into an `Any` with `type.googleapis.com/<full name>`.
pub fn pack<M: prost::Name>(msg: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: prost::Message::encode_to_vec(msg),
    }
}

/// Error returned by [`unpack`].
#[derive(Debug)]
pub enum UnpackError {
    /// The `Any` holds another type.
    WrongType { expected: String, found: String },
    /// The bytes do not decode as the expected message.
    Decode(prost::DecodeError),
}

impl std::fmt::Display for UnpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnpackError::WrongType { expected, found } => {
                write!(f, "expected a {expected}, found a {found}")
            }
            UnpackError::Decode(e) => write!(f, "decode: {e}"),
        }
    }
}

impl std::error::Error for UnpackError {}

/// Unpacks an `Any`, checking its type URL.
pub fn unpack<M: prost::Name + Default>(any: &Any) -> Result<M, UnpackError> {
    let expected = M::type_url();
    if any.type_url != expected {
        return Err(UnpackError::WrongType {
            expected,
            found: any.type_url.clone(),
        });
    }
    <M as prost::Message>::decode(any.value.as_slice()).map_err(UnpackError::Decode)
}

#[cfg(test)]
mod tests;
