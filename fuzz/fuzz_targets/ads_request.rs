//! ADS requests through istiod-lite's stream task (`control-plane/src/xds/ads/fuzz.rs`): node
//! parsing, authorization, resource names, nonces, ACK/NACK, the pushes they cause; never a
//! panic, a bounded number of responses per stream.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    control_plane::fuzzing::fuzz_ads_requests(data);
});
