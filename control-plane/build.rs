//! Compiles the few protos `istiod-lite replay` needs beyond envoy-types' descriptor set
//! (`protos/`: TypedStruct wrappers, the xDS IP matcher, Istio-only extension configs) into a
//! descriptor set in `OUT_DIR`, resolving their imports against that set. No system `protoc`.

use prost::Message;

const ENVOY_TYPES: &str = "descriptors/envoy-types.bin";
const PROTOS: [&str; 6] = [
    "udpa/type/v1/typed_struct.proto",
    "xds/type/v3/typed_struct.proto",
    "xds/type/matcher/v3/ip.proto",
    "istio/stats.proto",
    "istio/metadata_exchange.proto",
    "istio/alpn.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={ENVOY_TYPES}");
    println!("cargo:rerun-if-changed=protos");
    let envoy = std::fs::read(ENVOY_TYPES)?;
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(protox::file::IncludeFileResolver::new("protos".into()));
    resolver.add(protox::file::DescriptorSetFileResolver::decode(
        envoy.as_slice(),
    )?);
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(false);
    compiler.open_files(PROTOS)?;
    let set = compiler.file_descriptor_set();
    #[allow(clippy::disallowed_methods)] // a build script learns OUT_DIR from its environment
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("replay-extensions.bin");
    std::fs::write(out, set.encode_to_vec())?;
    Ok(())
}
