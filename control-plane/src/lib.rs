//! istiod-lite: a minimal Istio CA and ADS server for running the mesh without Kubernetes.
//!
//! Modules, lowest floor first; each names only those listed before it (the `floors` test
//! fails otherwise):
//!
//! - `listen`: listening sockets with a large backlog and an accept loop that never stops.
//! - `ca`: root material, CSR signing, tokens, the `IstioCertificateService`.
//! - `config`: Istio and Kubernetes YAML → typed objects, validation, the watched config directory (publishes
//!   config revisions).
//! - `model`: the mesh as the proxies see it: a snapshot per config revision, the service
//!   index, proxies. No xDS types.
//! - `settings`: istiod-lite's own configuration tree (flags, environment, mesh file), built
//!   once in `main` (→ model).
//! - `xds`: Envoy resources generated from a snapshot, the cache of generated resources, and
//!   the ADS server.
//! - `monitoring`: `/ready`, `/metrics`, `/debug/syncz`, `/debug/configz` (→ config, model, xds,
//!   listen).
//! - `vm_bundle`: the VM onboarding files (→ ca).
//! - `server`: the composition root of `istiod-lite serve`, and the core `replay` serves
//!   through (→ everything above).
//! - `replay`: `istiod-lite replay`, a recorded config dump served as it is (or stripped)
//!   through the xds side's fixed resources (→ server, xds).
//!
//! The modules are private; the API is what the root re-exports: the `serve`, `replay`, `token`
//! and `vm-bundle` commands of the `istiod-lite` binary, and the parts the integration tests
//! and benches drive on their own (the CA, the config parser, the model, the ADS server).
//! Feature `fuzzing` adds `fuzzing`, the fuzz targets' entry points.

#![forbid(unsafe_code)]

mod ca;
mod config;
#[cfg(test)]
mod floors;
mod listen;
mod model;
mod monitoring;
mod replay;
mod server;
mod settings;
mod vm_bundle;
mod xds;

// The commands of `istiod-lite` (src/main.rs).
pub use ca::TokenIssuer;
pub use listen::GRPC_CAPS;
pub use replay::serve as serve_replay;
pub use server::{Running, serve};
pub use settings::{ServerSettings, Settings};
pub use vm_bundle::{BundleInputs, write_bundle};

// The parts the integration tests (tests/) and the CA bench drive on their own.
pub use ca::{Ca, Claims, DEFAULT_TOKEN_CLOCK_SKEW, Identity, PREVIOUS_ROOTS};
pub use config::{Config, parse_file};
pub use listen::{GRPC_STREAM_LIMITS, bind, effective_backlog};
pub use model::{MeshSettings, ProxyView, Snapshot};
pub use xds::{AdsInputs, AdsServer, SyncTable, XdsMetrics, XdsType, generate};

/// Entry points of the fuzz targets (`fuzz/fuzz_targets/`); not part of the stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::ca::{identity_from_cert, split_pem_certs};
    pub use crate::xds::fuzz_ads_requests;
}
