//! End-to-end tests of pilot-agent and its pieces: the injected sidecar's lifecycle with real
//! Envoy against istiod-lite, lifecycle and identity faults, our SDS server against real Envoy,
//! and the image's root filesystem.
//!
//! One test binary for all of them; each module is one former binary, so a test's name is
//! `<module>::<test>` (`cargo nextest run -p tests --test agent agent_faults::`).

mod agent;
mod agent_faults;
mod identity_faults;
mod image;
mod sds;
