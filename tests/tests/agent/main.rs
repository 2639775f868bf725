//! End-to-end tests of pilot-agent and its pieces: the injected sidecar's lifecycle with real
//! Envoy against istiod-lite, lifecycle and identity faults, our SDS server against real Envoy,
//! the image's root filesystem, proxyless gRPC through the agent, the agent's own xDS
//! upstream reconnects, rewritten app probes as the kubelet sends them, the opt-in
//! lifecycle lockdown (`PROXY_LIFECYCLE_LOCKDOWN`), the cloud platform's metadata in the
//! bootstrap (`CLOUD_PLATFORM`), and the agent's CPU profile read back.
//!
//! One test binary for all of them; each module is one former binary, so a test's name is
//! `<module>::<test>` (`cargo nextest run -p tests --test agent agent_faults::`).

mod agent;
mod agent_faults;
mod grpc_go_multi;
mod grpc_proxyless;
mod identity_faults;
mod image;
mod istio_diff_bootstrap;
mod istio_diff_cli;
mod istio_diff_status;
mod istiod_failover;
mod live_istiod;
mod lockdown;
mod platform;
mod pprof;
mod probes;
mod sds;
mod spire;
mod templates;
mod warm_start;
mod xds_reconnect;
