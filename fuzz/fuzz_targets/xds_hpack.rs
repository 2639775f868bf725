//! A client's bytes on the agent's XDS socket through the `:authority` header rewriter (the
//! HPACK decoder and re-encoder below the HTTP/2 server): it must never panic, never hold more
//! than its header-list cap (HPACK bombs), and every header block it hands the server must
//! decode, with an empty table, within that cap.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    agent::fuzzing::fuzz_rewrite(data);
});
