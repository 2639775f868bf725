//! istiod-lite: a minimal Istio CA and ADS server for running the mesh without Kubernetes.
//!
//! Modules, lowest floor first; each names only those listed before it (the `floors` test
//! fails otherwise):
//!
//! - [`listen`]: listening sockets with a large backlog and an accept loop that never stops.
//! - [`ca`]: root material, CSR signing, tokens, the `IstioCertificateService`.
//! - [`config`]: Istio and Kubernetes YAML → typed objects, validation, the watched config directory (publishes
//!   config revisions).
//! - [`model`]: the mesh as the proxies see it: a snapshot per config revision, the service
//!   index, proxies. No xDS types.
//! - [`settings`]: istiod-lite's own configuration tree (flags, environment, mesh file), built
//!   once in `main` (→ model).
//! - [`xds`]: Envoy resources generated from a snapshot, the cache of generated resources, and
//!   the ADS server.
//! - [`monitoring`]: `/ready`, `/metrics`, `/debug/syncz`, `/debug/configz` (→ config, model, xds,
//!   listen).
//! - [`vm_bundle`]: the VM onboarding files (→ ca).
//! - [`server`]: the composition root of `istiod-lite serve`, and the core `replay` serves
//!   through (→ everything above).
//! - [`replay`]: `istiod-lite replay`, a recorded config dump served as it is (or stripped)
//!   through the xds side's fixed resources (→ server, xds).

#![forbid(unsafe_code)]

pub mod ca;
pub mod config;
#[cfg(test)]
mod floors;
pub mod listen;
pub mod model;
pub mod monitoring;
pub mod replay;
pub mod server;
pub mod settings;
pub mod vm_bundle;
pub mod xds;
