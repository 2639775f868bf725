//! End-to-end tests of istio-iptables with real iptables and nftables in network namespaces: the conformance
//! corpus through the real binary, the capture it programs, and its reliability (repeated,
//! alternating and killed runs).
//!
//! One test binary for both; each module is one former binary, so a test's name is
//! `<module>::<test>` (`cargo nextest run -p tests --test iptables iptables_reliability::`).

mod iptables;
mod iptables_reliability;
mod istio_diff;
mod nftables;
mod nftables_netlink;
