//! Compiles Istio's CA and NDS protos, and pprof's profile format, with protox (no system
//! `protoc`).
//! Well-known types map onto envoy-types' own `google.protobuf` so that one `Struct`/`Any`
//! flows through the whole workspace.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "protos/istio/ca.proto",
        "protos/istio/nds.proto",
        "protos/perftools/profile.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["protos"])?;
    let mut config = prost_build::Config::new();
    config.enable_type_names();
    config.type_name_domain(["."], "type.googleapis.com");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::envoy_types::pb::google::protobuf")
        .compile_fds_with_config(fds, config)?;
    Ok(())
}
