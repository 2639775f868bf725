//! Any packet through the DNS proxy's request path (table lookup, cache, EDNS, truncation, and
//! the upstream-answer path): it must never panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dns_proxy::fuzzing::fuzz_request(data);
});
