//! Fetching a module from an OCI registry (the distribution API over HTTPS, or plain HTTP
//! when the registry answers in it and `WASM_PLAIN_HTTP_REGISTRIES` names it): the
//! manifest (typed, at most [`MAX_MANIFEST`] bytes), whose sha256 is the module's checksum,
//! then the Wasm layer. Istio's three image
//! layouts: a Docker image or a standard OCI image whose last layer is a tar.gz holding
//! `plugin.wasm`, and the Wasm artifact whose `application/vnd.module.wasm.content.layer.v1+wasm`
//! layer is the binary itself.

use super::unpack::Body;
use super::{Error, Options, Work, fetch, sha256_hex};

const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";

/// Why a reference, a URL or a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("digest {digest:?}: expected sha256:<hex>")]
    DigestAlgorithm { digest: String },
    #[error("digest {digest:?}: expected 64 hex digits")]
    DigestHex { digest: String },
    #[error("{reference:?}: expected registry/repository")]
    Reference { reference: String },
    #[error(transparent)]
    Url(#[from] url::ParseError),
    #[error("manifest larger than {MAX_MANIFEST} bytes")]
    ManifestTooLarge,
    #[error("manifest is not an image manifest: {0}")]
    Manifest(#[source] serde_json::Error),
    #[error("number of layers must be greater than zero")]
    NoLayers,
    #[error("invalid media type {media_type} (expect {DOCKER_LAYER})")]
    DockerLayerType { media_type: String },
    #[error(
        "the image is in neither format: a last layer of type {OCI_LAYER}, or two layers one of type {WASM_LAYER}"
    )]
    Layout,
    #[error("layer without a digest")]
    LayerWithoutDigest,
}

/// `registry/repository[:tag][@sha256:digest]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl Reference {
    pub fn parse(s: &str) -> Result<Self, OciError> {
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| OciError::DigestAlgorithm { digest: d.into() })?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(OciError::DigestHex { digest: d.into() });
                }
                (r, Some(hex.to_ascii_lowercase()))
            }
            None => (s, None),
        };
        let (registry, path) = rest.split_once('/').ok_or_else(|| OciError::Reference {
            reference: s.into(),
        })?;
        // A tag is after the last `/`'s last `:`.
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, Some(t.to_string())),
            _ => (path, None),
        };
        if registry.is_empty() || repository.is_empty() {
            return Err(OciError::Reference {
                reference: s.into(),
            });
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

    fn url(&self, scheme: &str, kind: &str, what: &str) -> Result<url::Url, OciError> {
        Ok(url::Url::parse(&format!(
            "{scheme}://{}/v2/{}/{kind}/{what}",
            self.registry, self.repository
        ))?)
    }
}

/// The largest manifest read: the distribution spec's own limit. A real one is a few KiB.
pub(crate) const MAX_MANIFEST: u64 = 4 << 20;

/// A layer's descriptor: what the fetch needs of it.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    digest: Option<String>,
}

impl Descriptor {
    fn media_type(&self) -> &str {
        self.media_type.as_deref().unwrap_or_default()
    }
}

/// A manifest's layers as the three layouts need them: how many, the first two and the last.
/// Held in constant space whatever the count (a manifest of a million empty layers is four
/// MiB of text, not a million descriptors).
#[derive(Debug, Default)]
struct Layers {
    count: usize,
    first: Vec<Descriptor>,
    last: Option<Descriptor>,
}

impl<'de> serde::Deserialize<'de> for Layers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Layers;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of layer descriptors")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Layers, A::Error> {
                let mut l = Layers::default();
                while let Some(d) = seq.next_element::<Descriptor>()? {
                    l.count += 1;
                    if l.first.len() < 2 {
                        l.first.push(d.clone());
                    }
                    l.last = Some(d);
                }
                Ok(l)
            }
        }
        d.deserialize_seq(Visit)
    }
}

/// An image manifest, typed: only the fields the fetch reads (others are skipped unparsed).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Manifest {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    layers: Option<Layers>,
}

impl Manifest {
    /// Parses a manifest of at most [`MAX_MANIFEST`] bytes.
    pub(crate) fn parse(b: &[u8]) -> Result<Self, OciError> {
        if u64::try_from(b.len()).unwrap_or(u64::MAX) > MAX_MANIFEST {
            return Err(OciError::ManifestTooLarge);
        }
        serde_json::from_slice(b).map_err(OciError::Manifest)
    }

    /// The layer holding the module (Istio's three layouts: a Docker image or a standard OCI
    /// image whose last layer is a tar.gz, or the Wasm artifact's two layers) and whether it
    /// is packed (a tar.gz holding `plugin.wasm`).
    pub(crate) fn module_layer(&self) -> Result<(String, bool), OciError> {
        let empty = Layers::default();
        let layers = self.layers.as_ref().unwrap_or(&empty);
        let (layer, packed) = if self.media_type.as_deref() == Some(DOCKER_MANIFEST) {
            let last = layers.last.as_ref().ok_or(OciError::NoLayers)?;
            if last.media_type() != DOCKER_LAYER {
                return Err(OciError::DockerLayerType {
                    media_type: last.media_type().into(),
                });
            }
            (last, true)
        } else if let Some(last) = layers.last.as_ref().filter(|l| l.media_type() == OCI_LAYER) {
            (last, true)
        } else if layers.count == 2
            && let Some(w) = layers.first.iter().find(|l| l.media_type() == WASM_LAYER)
        {
            (w, false)
        } else {
            return Err(OciError::Layout);
        };
        let digest = layer.digest.clone().ok_or(OciError::LayerWithoutDigest)?;
        Ok((digest, packed))
    }
}

/// Whether a blob digest is `sha256:` and 64 hex digits (it becomes part of a URL path).
fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Fetches the image at `reference` (the URL without `oci://`): the layer holding the module
/// (checked against its digest) and the manifest's sha256. A `checksum` that the manifest
/// does not match fails before any layer is fetched. Hashing and parsing run on `work`.
pub(super) async fn fetch(
    opts: &Options,
    work: &Work,
    url: &str,
    reference: &str,
    checksum: &str,
) -> Result<(Body, String), Error> {
    let fail = |reason: String| Error::Fetch {
        url: url.to_string(),
        reason,
    };
    let r = Reference::parse(reference).map_err(|e| Error::Url {
        url: url.to_string(),
        reason: e.to_string(),
    })?;
    let (scheme, manifest) = fetch_manifest(opts, &r, url, &fail).await?;
    let parsed = work
        .run(move || (sha256_hex(&manifest), Manifest::parse(&manifest)))
        .await
        .map_err(|e| fail(e.to_string()))?;
    let (digest, manifest) = parsed;
    if !checksum.is_empty() && digest != checksum {
        return Err(Error::Checksum {
            url: url.to_string(),
            got: digest,
            want: checksum.to_string(),
        });
    }
    let (blob_digest, packed) = manifest
        .and_then(|m| m.module_layer())
        .map_err(|e| fail(e.to_string()))?;
    if !valid_digest(&blob_digest) {
        return Err(fail(format!(
            "layer digest {blob_digest:?}: expected sha256:<64 hex digits>"
        )));
    }
    let blob = fetch_layer(opts, work, &r, scheme, blob_digest, &fail).await?;
    Ok((Body::Layer { blob, packed }, digest))
}

/// The image's manifest, over HTTPS, or plain HTTP for a registry
/// `WASM_PLAIN_HTTP_REGISTRIES` names; returns the scheme that answered with it.
async fn fetch_manifest(
    opts: &Options,
    r: &Reference,
    url: &str,
    fail: &impl Fn(String) -> Error,
) -> Result<(&'static str, bytes::Bytes), Error> {
    // HTTPS; a registry that answers in plain HTTP is fetched over HTTP only when
    // `WASM_PLAIN_HTTP_REGISTRIES` names it (Istio falls back for every registry).
    let accept = format!("{OCI_MANIFEST}, {DOCKER_MANIFEST}");
    let mut scheme = "https";
    let manifest_url = r
        .url(scheme, "manifests", &r.reference())
        .map_err(|e| fail(e.to_string()))?;
    let (status, _, manifest) =
        match fetch::get(opts, &manifest_url, Some(&accept), MAX_MANIFEST).await {
            Err(e @ fetch::FetchError::PlainHttpAnswer) => {
                let (host, port) = (
                    manifest_url.host_str().unwrap_or_default(),
                    manifest_url.port(),
                );
                if !opts.plain_http(host, port) {
                    return Err(fail(format!(
                        "could not fetch manifest: {e}; the registry is not fetched over plain HTTP unless WASM_PLAIN_HTTP_REGISTRIES names it ({})",
                        r.registry
                    )));
                }
                tracing::info!(url, "fetching the image over plain HTTP");
                scheme = "http";
                let u = r.url(scheme, "manifests", &r.reference()).map_err(|e| fail(e.to_string()))?;
                fetch::get(opts, &u, Some(&accept), MAX_MANIFEST).await
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
    Ok((scheme, manifest))
}

/// The module's layer `blob_digest`, checked against its digest on `work`.
async fn fetch_layer(
    opts: &Options,
    work: &Work,
    r: &Reference,
    scheme: &str,
    blob_digest: String,
    fail: &impl Fn(String) -> Error,
) -> Result<bytes::Bytes, Error> {
    let blob_url = r
        .url(scheme, "blobs", &blob_digest)
        .map_err(|e| fail(e.to_string()))?;
    let (status, _, blob) = fetch::get(opts, &blob_url, None, opts.max_binary_size)
        .await
        .map_err(|e| fail(format!("could not fetch layer: {e}")))?;
    if status != http::StatusCode::OK {
        return Err(fail(format!(
            "could not fetch layer {blob_digest}: status code {}",
            status.as_u16()
        )));
    }
    let (blob, matches) = work
        .run(move || {
            let matches = blob_digest
                .strip_prefix("sha256:")
                .is_some_and(|d| d.eq_ignore_ascii_case(&sha256_hex(&blob)));
            (blob, matches.then_some(()).ok_or(blob_digest))
        })
        .await
        .map_err(|e| fail(e.to_string()))?;
    if let Err(d) = matches {
        return Err(fail(format!("layer does not match its digest {d}")));
    }
    Ok(blob)
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
        assert!(matches!(
            Reference::parse("plugin"),
            Err(OciError::Reference { .. })
        ));
        assert!(matches!(
            Reference::parse("reg/p@md5:00"),
            Err(OciError::DigestAlgorithm { .. })
        ));
    }

    fn layer(media: &str, digest: &str) -> String {
        format!(r#"{{"mediaType":"{media}","digest":"{digest}","size":1}}"#)
    }

    /// Istio's three layouts from the typed manifest; anything else is refused with a reason.
    #[test]
    fn manifests_pick_the_module_layer() {
        let pick = |m: String| Manifest::parse(m.as_bytes()).and_then(|m| m.module_layer());
        let docker = format!(
            r#"{{"mediaType":"{DOCKER_MANIFEST}","layers":[{},{}]}}"#,
            layer("x", "a"),
            layer(DOCKER_LAYER, "b")
        );
        assert_eq!(pick(docker).unwrap(), ("b".into(), true));
        let oci = format!(r#"{{"layers":[{}]}}"#, layer(OCI_LAYER, "c"));
        assert_eq!(pick(oci).unwrap(), ("c".into(), true));
        let artifact = format!(
            r#"{{"layers":[{},{}]}}"#,
            layer("config", "d"),
            layer(WASM_LAYER, "e")
        );
        assert_eq!(pick(artifact).unwrap(), ("e".into(), false));
        let three = format!(
            r#"{{"layers":[{},{},{}]}}"#,
            layer(WASM_LAYER, "e"),
            layer("x", "f"),
            layer("y", "g")
        );
        assert!(matches!(pick(three), Err(OciError::Layout)));
        let docker_bad = format!(
            r#"{{"mediaType":"{DOCKER_MANIFEST}","layers":[{}]}}"#,
            layer(OCI_LAYER, "b")
        );
        assert!(matches!(
            pick(docker_bad),
            Err(OciError::DockerLayerType { media_type }) if media_type == OCI_LAYER
        ));
        assert!(pick(r#"{"layers":null}"#.into()).is_err());
        assert!(pick(r#"{"layers":[{"mediaType":7}]}"#.into()).is_err());
        assert!(pick("[]".into()).is_err());
        let no_digest = format!(r#"{{"layers":[{{"mediaType":"{OCI_LAYER}"}}]}}"#);
        assert!(matches!(pick(no_digest), Err(OciError::LayerWithoutDigest)));
    }

    /// Past 4 MiB a manifest is refused before parsing; below it, a million layers keep three.
    #[test]
    fn manifest_size_is_capped_and_layers_kept_in_constant_space() {
        let big = vec![b' '; usize::try_from(MAX_MANIFEST).unwrap() + 1];
        assert!(matches!(
            Manifest::parse(&big),
            Err(OciError::ManifestTooLarge)
        ));
        let mut many = String::from(r#"{"layers":["#);
        many.push_str(&"{},".repeat(1_000_000));
        many.push_str(&layer(OCI_LAYER, "last"));
        many.push_str("]}");
        let m = Manifest::parse(many.as_bytes()).unwrap();
        let layers = m.layers.as_ref().unwrap();
        assert_eq!((layers.count, layers.first.len()), (1_000_001, 2));
        assert_eq!(m.module_layer().unwrap(), ("last".into(), true));
    }
}
