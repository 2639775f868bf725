//! pilot-agent: the istio-proxy container's process (xDS proxy, SDS, DNS, Envoy lifecycle,
//! status port).
//!
//! - [`cli`]: Istio's command line (`proxy`, `wait`, `request`, `version`, `istio-iptables`,
//!   `bootstrap`).
//! - [`config`]: the typed configuration (flags, env map, ProxyConfig layers).
//! - [`bootstrap`]: Envoy's bootstrap and node metadata; the gRPC xDS bootstrap.
//! - `identity`: who serves the workload identity sockets (an external SDS server such as
//!   SPIRE's?), settled when the agent binds, not when the configuration loads.
//! - [`platform`]: the cloud platform (`CLOUD_PLATFORM`, else discovered) the node metadata
//!   and locality take facts from.
//! - `envoy`: Envoy's argv, process and drain sequence.
//! - `status`: the status server on 15020.
//! - [`lifecycle`]: the one shutdown signal and readiness guards.
//! - [`runtime`]: the one-thread runtime and the malloc tuning that keep the agent small.
//! - `sock_diag`: the uid owning a loopback peer's socket (netlink inet_diag).
//! - `cpu_profile`: the agent's CPU profile in pprof's format (`/debug/pprof/profile`).
//!
//! The modules the binary, the fuzz targets, the benches and `agent/tests` reach are public;
//! `envoy`, `identity`, `status`, `health`, `http1`, `cgroup`, `sock_diag` and `cpu_profile` are the crate's
//! own.

// unsafe only where a module or function allows it: malloc tuning and rlimits (runtime.rs),
// the pre-exec hook that ties Envoy to the agent (envoy.rs), the CPU profiler's timer and
// signal handler (cpu_profile/sampler.rs).
#![deny(unsafe_code)]

pub mod app;
pub mod bootstrap;
mod cgroup;
pub mod cli;
pub mod client;
pub mod config;
mod cpu_profile;
mod envoy;
#[cfg(test)]
mod floors;
mod health;
mod http1;
mod identity;
pub mod lifecycle;
#[cfg(test)]
mod log_capture;
pub mod log_format;
pub mod log_scopes;
pub mod platform;
pub mod runtime;
mod sock_diag;
mod status;
pub mod xds_proxy;

/// Entry points for the fuzz targets in `fuzz/`; not part of the stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::status::route::check_request as check_status_request;
    pub use crate::xds_proxy::fuzzing::{
        ResponseHead, check_against_prost, decode_response_head, fuzz_rewrite, relay_frames,
        wasm_manifest, wasm_unpack,
    };
}
