//! istiod-lite's config files: Istio resources in (multi-document) YAML parsed into the model.
//! Bad input is a list of errors, never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(objects) = control_plane::parse_file("fuzz.yaml", text) {
        let cfg = control_plane::Config::from_objects(objects);
        let _ = cfg.len();
    }
});
