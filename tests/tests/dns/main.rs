//! End-to-end tests of the DNS proxy: against `dig` and a real `dnsmasq` upstream, captured in
//! a pod namespace, under malformed packets and floods, and against Istio's own agent's
//! recorded answers (`istio_diff::`, the `dns` differential suite of issue #26).
//!
//! One test binary for both; each module is one former binary, so a test's name is
//! `<module>::<test>` (`cargo nextest run -p tests --test dns dns_flood::`). The nextest config
//! runs `dns_flood::` tests alone (they saturate both cores on purpose).

mod dns;
mod dns_flood;
mod istio_diff;
