//! What a Wasm module server or OCI registry sends the agent: the image manifest (typed
//! parsing, the layer picked among Istio's three layouts) and the body or layer unpacking
//! (nested gzip and tar, each layer capped). Neither may panic, the unpacked module may never
//! pass the cap, and an HTTP body that unpacks to nothing is returned as it came.
#![no_main]

use libfuzzer_sys::fuzz_target;

/// The cap the target unpacks under: small, so that a bomb shows at once.
const CAP: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => {
            let _ = agent::fuzzing::wasm_manifest(rest);
        }
        1 => {
            if let Ok(out) = agent::fuzzing::wasm_unpack(rest, false, CAP) {
                assert!(out.len() as u64 <= CAP.max(rest.len() as u64));
            }
        }
        _ => {
            if let Ok(out) = agent::fuzzing::wasm_unpack(rest, true, CAP) {
                assert!(out.len() as u64 <= CAP);
            }
        }
    }
});
