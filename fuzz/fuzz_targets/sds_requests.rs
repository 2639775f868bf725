//! SDS requests in any order through the loop every SDS stream runs (`sds/src/server/fuzz.rs`):
//! unknown and file resource names, stale nonces, ACKs and NACKs, SotW and Delta; never a
//! panic, a bounded number of responses per stream.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sds::fuzzing::fuzz_sds_requests(data);
});
