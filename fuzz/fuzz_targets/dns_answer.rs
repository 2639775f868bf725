//! Upstream DNS answers, large and truncated, through the DNS proxy's answer path (parse, cache,
//! rewrite, cut to size): never a panic, and the cache stays within its byte and entry budget.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dns_proxy::fuzzing::fuzz_upstream_answer(data);
});
