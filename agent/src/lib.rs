//! pilot-agent: the istio-proxy container's process (xDS proxy, SDS, DNS, Envoy lifecycle,
//! status port).
//!
//! The library exists for the `pilot-agent` binary; its root re-exports what the binary calls
//! and nothing else. Integration tests (`agent/tests`) build the configuration through the
//! `testing` feature; the fuzz targets (`fuzz/`) reach their decoders through `fuzzing`.
//!
//! - `cli`: Istio's command line (`proxy`, `wait`, `request`, `version`, `istio-iptables`,
//!   `bootstrap`); `client`: the `wait` and `request` commands.
//! - `config`: the typed configuration (flags, env map, ProxyConfig layers).
//! - `app`: the composition root (binds every listener, runs the agent and Envoy).
//! - `bootstrap`: Envoy's bootstrap and node metadata; the gRPC xDS bootstrap.
//! - `identity`: who serves the workload identity sockets (an external SDS server such as
//!   SPIRE's?), settled when the agent binds, not when the configuration loads.
//! - `platform`: the cloud platform (`CLOUD_PLATFORM`, else discovered) the node metadata
//!   and locality take facts from.
//! - `envoy`: Envoy's argv, process and drain sequence.
//! - `status`: the status server on 15020; `health`: the workload health check.
//! - `xds_proxy`: Envoy's ADS relayed to istiod.
//! - The one shutdown signal, the readiness guards and the components' supervisor are
//!   `proto::lifecycle`, shared with istiod-lite.
//! - `runtime`: the one-thread runtime and the malloc tuning that keep the agent small.
//! - `log_scopes`, `log_format`: Istio's log scopes and line layout.
//! - `sock_diag`: the uid owning a loopback peer's socket (netlink inet_diag).
//! - `cpu_profile`: the agent's CPU profile in pprof's format (`/debug/pprof/profile`).

// unsafe only where a module or function allows it: malloc tuning and rlimits (runtime.rs),
// the pre-exec hook that ties Envoy to the agent (envoy.rs), the CPU profiler's timer and
// signal handler (cpu_profile/sampler.rs).
#![deny(unsafe_code)]

mod app;
mod bootstrap;
mod cgroup;
mod cli;
mod client;
mod config;
mod cpu_profile;
mod envoy;
#[cfg(test)]
mod floors;
mod health;
mod http1;
mod identity;
#[cfg(test)]
mod log_capture;
mod log_format;
mod log_scopes;
mod platform;
mod runtime;
mod sock_diag;
mod status;
mod xds_proxy;

pub use app::{discover_platform, load_config, proxy, write_bootstrap};
pub use cli::{
    Command, LogFlags, USAGE_ERROR_CODE, completion_script, parse as parse_args, version_text,
};
pub use client::{request, wait};
pub use config::{Config, NodeType, ProxyFlags};
pub use log_format::istio_format;
pub use log_scopes::filter as log_filter;
pub use proto::lifecycle::Shutdown;
pub use runtime::{build as build_runtime, raise_open_file_limit, tune_malloc};

/// What `agent/tests` builds a configuration from ([`Config::load`]) and renders a bootstrap
/// on ([`write_bootstrap`] with `Platform::none()`); not part of the binary's API.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing {
    pub use crate::config::Inputs;
    pub use crate::platform::Platform;
}

/// Entry points for the fuzz targets in `fuzz/`; not part of the stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::config::probe::{parse_probers, parse_prometheus_annotations};
    pub use crate::status::route::check_request as check_status_request;
    pub use crate::xds_proxy::fuzzing::{
        ResponseHead, check_against_prost, decode_response_head, fuzz_rewrite, relay_frames,
        wasm_manifest, wasm_unpack,
    };
}
