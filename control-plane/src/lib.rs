//! istiod-lite: a minimal Istio CA and ADS server for running the mesh without Kubernetes.
//!
//! - [`ca`]: root material, CSR signing, tokens, the `IstioCertificateService`.
//! - [`config`]: Istio YAML kinds, validation, the watched config directory.
//! - [`model`]: immutable snapshots, the service index, proxies.
//! - [`xds`]: resource generation for upstream Envoy and the ADS server.
//! - [`monitoring`]: `/ready`, `/metrics`, `/debug/syncz`, `/debug/configz`.
//! - [`server`]: the composition root of `istiod-lite serve`.
//! - [`replay`]: `istiod-lite replay`, a recorded config dump served as it is (or stripped).
//! - [`vm_bundle`]: the VM onboarding files.

pub mod ca;
pub mod config;
pub mod model;
pub mod monitoring;
pub mod replay;
pub mod server;
pub mod vm_bundle;
pub mod xds;
