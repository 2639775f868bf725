//! End-to-end tests of pilot-agent and its pieces: the injected sidecar's lifecycle with real
//! Envoy against istiod-lite, lifecycle and identity faults, our SDS server against real Envoy,
//! the image's root filesystem, proxyless gRPC through the agent, and the agent's own xDS
//! upstream reconnects.
//!
//! One test binary for all of them; each module is one former binary, so a test's name is
//! `<module>::<test>` (`cargo nextest run -p tests --test agent agent_faults::`).

mod agent;
mod agent_faults;
mod grpc_proxyless;
mod identity_faults;
mod image;
mod istiod_failover;
mod sds;
mod xds_reconnect;
