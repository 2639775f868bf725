//! The gRPC xDS bootstrap (`GRPC_XDS_BOOTSTRAP`) for proxyless gRPC clients.

use std::path::PathBuf;

use serde_json::json;

use super::{Error, metadata};
use crate::config::Config;
use crate::identity::Sockets;
use crate::platform::Platform;

/// Writes the gRPC xDS bootstrap (`GRPC_XDS_BOOTSTRAP`) for proxyless clients: the node's id,
/// metadata and locality (a pod label's, else `platform`'s), as Envoy's bootstrap has them.
pub fn write_grpc_bootstrap(
    config: &Config,
    sockets: Sockets,
    platform: &Platform,
) -> Result<PathBuf, Error> {
    let node = metadata::node(config, sockets, platform)?;
    let mut meta = node.metadata;
    meta.insert("GENERATOR".into(), json!("grpc"));
    let xds = config.xds_socket();
    let mut doc = json!({
        "xds_servers": [{
            "server_uri": format!("unix:///{}", xds.display().to_string().trim_start_matches('/')),
            "channel_creds": [{ "type": "insecure" }],
            "server_features": ["xds_v3"]
        }],
        "node": { "id": config.node_id(), "metadata": meta, "locality": node.locality.to_json() },
        "server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s"
    });
    if let Some(dir) = &config.identity.output_certs {
        doc["certificate_providers"] = json!({
            "default": {
                "plugin_name": "file_watcher",
                "config": {
                    "certificate_file": dir.join("cert-chain.pem"),
                    "private_key_file": dir.join("key.pem"),
                    "ca_certificate_file": dir.join("root-cert.pem"),
                    "refresh_interval": "900s"
                }
            }
        });
    }
    let path = config.bootstrap.grpc_xds_bootstrap.clone();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&doc).unwrap_or_default())
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|source| Error::Write {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}
