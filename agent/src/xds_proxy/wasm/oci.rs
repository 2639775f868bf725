//! Fetching a module from an OCI registry (the distribution API over HTTPS, or plain HTTP
//! when the registry answers in it): the
//! manifest, whose sha256 is the module's checksum, then the Wasm layer. Istio's three image
//! layouts: a Docker image or a standard OCI image whose last layer is a tar.gz holding
//! `plugin.wasm`, and the Wasm artifact whose `application/vnd.module.wasm.content.layer.v1+wasm`
//! layer is the binary itself.

use serde_json::Value;

use super::{Error, Options, fetch, sha256_hex};

const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
const PLUGIN_FILE: &str = "plugin.wasm";

/// `registry/repository[:tag][@sha256:digest]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl Reference {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| format!("digest {d:?}: expected sha256:<hex>"))?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("digest {d:?}: expected 64 hex digits"));
                }
                (r, Some(hex.to_ascii_lowercase()))
            }
            None => (s, None),
        };
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: expected registry/repository"))?;
        // A tag is after the last `/`'s last `:`.
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, Some(t.to_string())),
            _ => (path, None),
        };
        if registry.is_empty() || repository.is_empty() {
            return Err(format!("{s:?}: expected registry/repository"));
        }
        Ok(Reference {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// The repository's full name (registry and path, no tag or digest).
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The digest the reference pins (hex), if any.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    fn reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => format!("sha256:{d}"),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }

    fn url(&self, scheme: &str, kind: &str, what: &str) -> Result<url::Url, String> {
        url::Url::parse(&format!(
            "{scheme}://{}/v2/{}/{kind}/{what}",
            self.registry, self.repository
        ))
        .map_err(|e| e.to_string())
    }
}

/// Fetches the image at `reference` (the URL without `oci://`): the Wasm binary and the
/// manifest's sha256. A `checksum` that the manifest does not match fails before any layer
/// is fetched.
pub(super) async fn fetch(
    opts: &Options,
    url: &str,
    reference: &str,
    checksum: &str,
) -> Result<(Vec<u8>, String), Error> {
    let fail = |reason: String| Error::Fetch {
        url: url.to_string(),
        reason,
    };
    let r = Reference::parse(reference).map_err(|reason| Error::Url {
        url: url.to_string(),
        reason,
    })?;
    // HTTPS first; a registry that answers in plain HTTP is fetched over HTTP (Istio's
    // fallback).
    let accept = format!("{OCI_MANIFEST}, {DOCKER_MANIFEST}");
    let mut scheme = "https";
    let manifest_url = r.url(scheme, "manifests", &r.reference()).map_err(&fail)?;
    let (status, _, manifest) = match fetch::get(opts, &manifest_url, Some(&accept)).await {
        Err(e) if e == fetch::PLAIN_HTTP_ANSWER => {
            tracing::info!(url, "fetching the image over plain HTTP");
            scheme = "http";
            let u = r.url(scheme, "manifests", &r.reference()).map_err(&fail)?;
            fetch::get(opts, &u, Some(&accept)).await
        }
        other => other,
    }
    .map_err(|e| fail(format!("could not fetch manifest: {e}")))?;
    if status != http::StatusCode::OK {
        return Err(fail(format!(
            "could not fetch manifest: status code {}",
            status.as_u16()
        )));
    }
    let digest = sha256_hex(&manifest);
    if !checksum.is_empty() && digest != checksum {
        return Err(Error::Checksum {
            url: url.to_string(),
            got: digest,
            want: checksum.to_string(),
        });
    }
    let m: Value = serde_json::from_slice(&manifest)
        .map_err(|e| fail(format!("manifest is not JSON: {e}")))?;
    let layers = m["layers"].as_array().cloned().unwrap_or_default();
    let layer_type = |l: &Value| l["mediaType"].as_str().unwrap_or_default().to_string();
    let (layer, packed) = if m["mediaType"] == DOCKER_MANIFEST {
        let last = layers
            .last()
            .ok_or_else(|| fail("number of layers must be greater than zero".into()))?;
        if layer_type(last) != DOCKER_LAYER {
            return Err(fail(format!(
                "invalid media type {} (expect {DOCKER_LAYER})",
                layer_type(last)
            )));
        }
        (last.clone(), true)
    } else if let Some(last) = layers.last().filter(|l| layer_type(l) == OCI_LAYER) {
        (last.clone(), true)
    } else if layers.len() == 2
        && let Some(w) = layers.iter().find(|l| layer_type(l) == WASM_LAYER)
    {
        (w.clone(), false)
    } else {
        return Err(fail(format!(
            "the image is in neither format: a last layer of type {OCI_LAYER}, or two layers one of type {WASM_LAYER}"
        )));
    };
    let blob_digest = layer["digest"]
        .as_str()
        .ok_or_else(|| fail("layer without a digest".into()))?;
    let blob_url = r.url(scheme, "blobs", blob_digest).map_err(&fail)?;
    let (status, _, blob) = fetch::get(opts, &blob_url, None)
        .await
        .map_err(|e| fail(format!("could not fetch layer: {e}")))?;
    if status != http::StatusCode::OK {
        return Err(fail(format!(
            "could not fetch layer {blob_digest}: status code {}",
            status.as_u16()
        )));
    }
    if blob_digest.strip_prefix("sha256:") != Some(sha256_hex(&blob).as_str()) {
        return Err(fail(format!(
            "layer does not match its digest {blob_digest}"
        )));
    }
    let binary = if packed {
        let tar = fetch::gunzip(&blob, opts.max_binary_size)
            .ok_or_else(|| fail("failed to parse layer as tar.gz".into()))?;
        fetch::tar_file(&tar, |name| name == PLUGIN_FILE)
            .ok_or_else(|| fail(format!("{PLUGIN_FILE} not found in the archive")))?
    } else {
        blob.to_vec()
    };
    Ok((binary, digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r = Reference::parse("127.0.0.1:5000/ns/plugin:v1").unwrap();
        assert_eq!(r.name(), "127.0.0.1:5000/ns/plugin");
        assert_eq!(r.reference(), "v1");
        let d = "a".repeat(64);
        let r = Reference::parse(&format!("reg/plugin@sha256:{d}")).unwrap();
        assert_eq!(
            (r.name().as_str(), r.digest()),
            ("reg/plugin", Some(d.as_str()))
        );
        assert_eq!(
            Reference::parse("reg:5000/p").unwrap().reference(),
            "latest"
        );
        assert!(Reference::parse("plugin").is_err());
        assert!(Reference::parse("reg/p@md5:00").is_err());
    }
}
