//! The crate's modules in floor order, lowest first: a module names (`crate::x`, in code or in
//! a doc link) only modules on the floors below it, so no two modules reach each other. The
//! scanner is the workspace's one (`tests/src/floors.rs`).

mod scan {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/src/floors.rs"
    ));
}

/// Top-level modules, lowest first.
const FLOORS: &[&str] = &[
    "log_capture",
    "log_scopes",
    "log_format",
    "runtime",
    "cpu_profile",
    "sock_diag",
    "http1",
    "cgroup",
    "config",
    "identity",
    "platform",
    "bootstrap",
    "cli",
    "client",
    "envoy",
    "status",
    "health",
    "xds_proxy",
    "app",
];

/// Pairs that point up, each with its reason.
const ALLOWED: &[(&str, &str)] = &[
    // `config::XdsUpstream` carries the Wasm fetch settings as `xds_proxy::wasm::Options`,
    // whose type is defined beside the fetcher.
    ("config", "xds_proxy"),
];

#[test]
fn modules_name_only_modules_on_floors_below() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    scan::check(&src, FLOORS, ALLOWED);
}
