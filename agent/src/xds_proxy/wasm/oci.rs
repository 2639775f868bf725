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
    pub(crate) fn parse(b: &[u8]) -> Result<Self, String> {
        if u64::try_from(b.len()).unwrap_or(u64::MAX) > MAX_MANIFEST {
            return Err(format!("manifest larger than {MAX_MANIFEST} bytes"));
        }
        serde_json::from_slice(b).map_err(|e| format!("manifest is not an image manifest: {e}"))
    }

    /// The layer holding the module (Istio's three layouts: a Docker image or a standard OCI
    /// image whose last layer is a tar.gz, or the Wasm artifact's two layers) and whether it
    /// is packed (a tar.gz holding `plugin.wasm`).
    pub(crate) fn module_layer(&self) -> Result<(String, bool), String> {
        let empty = Layers::default();
        let layers = self.layers.as_ref().unwrap_or(&empty);
        let (layer, packed) = if self.media_type.as_deref() == Some(DOCKER_MANIFEST) {
            let last = layers
                .last
                .as_ref()
                .ok_or("number of layers must be greater than zero")?;
            if last.media_type() != DOCKER_LAYER {
                return Err(format!(
                    "invalid media type {} (expect {DOCKER_LAYER})",
                    last.media_type()
                ));
            }
            (last, true)
        } else if let Some(last) = layers.last.as_ref().filter(|l| l.media_type() == OCI_LAYER) {
            (last, true)
        } else if layers.count == 2
            && let Some(w) = layers.first.iter().find(|l| l.media_type() == WASM_LAYER)
        {
            (w, false)
        } else {
            return Err(format!(
                "the image is in neither format: a last layer of type {OCI_LAYER}, or two layers one of type {WASM_LAYER}"
            ));
        };
        let digest = layer.digest.clone().ok_or("layer without a digest")?;
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
    let r = Reference::parse(reference).map_err(|reason| Error::Url {
        url: url.to_string(),
        reason,
    })?;
    // HTTPS; a registry that answers in plain HTTP is fetched over HTTP only when
    // `WASM_PLAIN_HTTP_REGISTRIES` names it (Istio falls back for every registry).
    let accept = format!("{OCI_MANIFEST}, {DOCKER_MANIFEST}");
    let mut scheme = "https";
    let manifest_url = r.url(scheme, "manifests", &r.reference()).map_err(&fail)?;
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
                let u = r.url(scheme, "manifests", &r.reference()).map_err(&fail)?;
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
    let parsed = work
        .run(move || (sha256_hex(&manifest), Manifest::parse(&manifest)))
        .await
        .map_err(&fail)?;
    let (digest, manifest) = parsed;
    if !checksum.is_empty() && digest != checksum {
        return Err(Error::Checksum {
            url: url.to_string(),
            got: digest,
            want: checksum.to_string(),
        });
    }
    let (blob_digest, packed) = manifest.and_then(|m| m.module_layer()).map_err(&fail)?;
    if !valid_digest(&blob_digest) {
        return Err(fail(format!(
            "layer digest {blob_digest:?}: expected sha256:<64 hex digits>"
        )));
    }
    let blob_url = r.url(scheme, "blobs", &blob_digest).map_err(&fail)?;
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
        .map_err(&fail)?;
    if let Err(d) = matches {
        return Err(fail(format!("layer does not match its digest {d}")));
    }
    Ok((Body::Layer { blob, packed }, digest))
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
        assert!(pick(three).unwrap_err().contains("neither format"));
        let docker_bad = format!(
            r#"{{"mediaType":"{DOCKER_MANIFEST}","layers":[{}]}}"#,
            layer(OCI_LAYER, "b")
        );
        assert!(pick(docker_bad).unwrap_err().contains("invalid media type"));
        assert!(pick(r#"{"layers":null}"#.into()).is_err());
        assert!(pick(r#"{"layers":[{"mediaType":7}]}"#.into()).is_err());
        assert!(pick("[]".into()).is_err());
        let no_digest = format!(r#"{{"layers":[{{"mediaType":"{OCI_LAYER}"}}]}}"#);
        assert!(pick(no_digest).unwrap_err().contains("without a digest"));
    }

    /// Past 4 MiB a manifest is refused before parsing; below it, a million layers keep three.
    #[test]
    fn manifest_size_is_capped_and_layers_kept_in_constant_space() {
        let big = vec![b' '; usize::try_from(MAX_MANIFEST).unwrap() + 1];
        assert!(Manifest::parse(&big).unwrap_err().contains("larger than"));
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
