//! istiod-lite's gRPC services tested from outside the crate: ADS pushes with a scripted
//! Envoy-like client, the CA (`IstioCertificateService`) on a running `server::serve`, and 2,000
//! simulated proxies reconnecting at once to a real `istiod-lite serve` process.
//!
//! One test binary for all of them; each module is one former binary, so a test's name is
//! `<module>::<test>` (`cargo nextest run -p control-plane --test grpc reconnect_burst::`).

mod ads;
mod ads_auth;
mod ca_grpc;
mod common;
mod limits;
mod reconnect_burst;
