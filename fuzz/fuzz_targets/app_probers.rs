//! `ISTIO_KUBE_APP_PROBERS` and `ISTIO_PROMETHEUS_ANNOTATIONS` as the agent reads them (Go's
//! JSON rules: keys folded, later keys win): the parsers must never panic, and every prober
//! they accept is served on a path of the form `/app-health|app-lifecycle/<container>/<probe>`,
//! so nothing else on the status port can be shadowed by a probe.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(probers) = agent::fuzzing::parse_probers(&text) {
        for path in probers.keys() {
            let parts: Vec<&str> = path.split('/').collect();
            assert!(
                parts.len() == 4
                    && parts[0].is_empty()
                    && matches!(parts[1], "app-health" | "app-lifecycle")
                    && !parts[2].is_empty(),
                "accepted a prober on {path:?}"
            );
        }
    }
    let _ = agent::fuzzing::parse_prometheus_annotations(&text, 15020);
});
