//! End-to-end tests of the mesh: pods in a box (fed Istio or Kubernetes YAML) and a VM against
//! istiod-lite, with real Envoy, real iptables and real traffic in network namespaces;
//! istiod-lite against a plain Envoy; a local Envoy behind `pilot-agent --external-envoy`; the
//! soak and the root CA change; recorded Istio config dumps replayed by `istiod-lite replay`.
//!
//! One test binary for all of them (one link instead of eight); each module is one former
//! binary, so a test's name is `<module>::<test>` (`cargo nextest run -p tests --test mesh
//! soak::`).

mod control_plane;
mod kube;
mod kubelet;
mod local_envoy;
mod outage;
mod pod;
mod replay;
mod root_ca_rotation;
mod security;
mod smoke;
mod soak;
mod vm;
