//! A request to the status port (15020) as the status server routes it, without sockets: its
//! path, query, method and headers, from a peer inside the pod or not, and an app's or Envoy's
//! metrics text. Never a panic; privileged endpoints only from inside the pod; app probes only
//! on their paths; no hop-by-hop header passed on to an app; merged metrics well formed (see
//! `agent/src/status/route.rs`, `check_request`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    agent::fuzzing::check_status_request(data);
});
