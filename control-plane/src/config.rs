//! Istio and Kubernetes configuration from `*.yaml` files: parsing, validation, and the watched
//! directory.
//!
//! Each file may hold several YAML documents, and a document may be a `kind: List` of objects
//! (as `kubectl get ... -o yaml` writes). An Istio document is
//! `{apiVersion, kind, metadata: {name, namespace}, spec}` with the kinds in [`kinds`]; the
//! Kubernetes kinds (`Service`, `EndpointSlice`, `Endpoints`, `Pod`, `Namespace`) are in
//! [`kube`]. A file with any bad document is rejected as a whole and its last good contents stay
//! in force; every rejection names the file, the document index (0-based), the field (with
//! `items[i].` for a List item) and the reason.

mod expansion;
pub mod export_to;
pub mod kinds;
pub mod kube;
mod validate;
mod watch;

pub use watch::{ConfigStatus, Revision, WatchError, Watcher, WatcherInputs};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use kinds::*;

/// One rejected document (or unreadable file).
#[derive(Clone, Debug, PartialEq, Serialize, thiserror::Error)]
#[error("{file}: document {doc}: {field}: {reason}")]
pub struct ConfigError {
    pub file: String,
    pub doc: usize,
    pub field: String,
    pub reason: String,
}

/// Object metadata.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Meta {
    pub name: String,
    pub namespace: String,
    pub labels: Labels,
}

/// One validated object.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", content = "spec")]
pub enum Spec {
    ServiceEntry(ServiceEntry),
    WorkloadEntry(WorkloadEntry),
    VirtualService(VirtualService),
    DestinationRule(DestinationRule),
    PeerAuthentication(PeerAuthentication),
    Sidecar(Sidecar),
    Service(kube::Service),
    EndpointSlice(kube::EndpointSlice),
    /// A `v1 Endpoints`, one list per subset.
    Endpoints(Vec<kube::EndpointSlice>),
    Pod(kube::Pod),
    Namespace(kube::Namespace),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Object<T> {
    pub meta: Meta,
    pub spec: T,
}

/// The whole validated configuration, each kind sorted by (namespace, name).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    pub service_entries: Vec<Object<ServiceEntry>>,
    pub workload_entries: Vec<Object<WorkloadEntry>>,
    pub virtual_services: Vec<Object<VirtualService>>,
    pub destination_rules: Vec<Object<DestinationRule>>,
    pub peer_authentications: Vec<Object<PeerAuthentication>>,
    pub sidecars: Vec<Object<Sidecar>>,
    /// Kubernetes `Service`s.
    pub services: Vec<Object<kube::Service>>,
    pub endpoint_slices: Vec<Object<kube::EndpointSlice>>,
    /// `v1 Endpoints`, one list per subset (used for a Service that has no EndpointSlice).
    pub endpoints: Vec<Object<Vec<kube::EndpointSlice>>>,
    pub pods: Vec<Object<kube::Pod>>,
    pub namespaces: Vec<Object<kube::Namespace>>,
}

impl Config {
    /// Builds a config from objects (later duplicates of kind/namespace/name win).
    pub fn from_objects(objects: impl IntoIterator<Item = (Meta, Spec)>) -> Config {
        let mut c = Config::default();
        for (meta, spec) in objects {
            match spec {
                Spec::ServiceEntry(s) => c.service_entries.push(Object { meta, spec: s }),
                Spec::WorkloadEntry(s) => c.workload_entries.push(Object { meta, spec: s }),
                Spec::VirtualService(s) => c.virtual_services.push(Object { meta, spec: s }),
                Spec::DestinationRule(s) => c.destination_rules.push(Object { meta, spec: s }),
                Spec::PeerAuthentication(s) => {
                    c.peer_authentications.push(Object { meta, spec: s })
                }
                Spec::Sidecar(s) => c.sidecars.push(Object { meta, spec: s }),
                Spec::Service(s) => c.services.push(Object { meta, spec: s }),
                Spec::EndpointSlice(s) => c.endpoint_slices.push(Object { meta, spec: s }),
                Spec::Endpoints(s) => c.endpoints.push(Object { meta, spec: s }),
                Spec::Pod(s) => c.pods.push(Object { meta, spec: s }),
                Spec::Namespace(s) => c.namespaces.push(Object { meta, spec: s }),
            }
        }
        fn norm<T>(v: &mut Vec<Object<T>>) {
            // Stable sort then keep the last of each (namespace, name).
            v.sort_by(|a, b| {
                (&a.meta.namespace, &a.meta.name).cmp(&(&b.meta.namespace, &b.meta.name))
            });
            let mut out: Vec<Object<T>> = Vec::with_capacity(v.len());
            for o in v.drain(..) {
                if let Some(last) = out.last_mut()
                    && last.meta.namespace == o.meta.namespace
                    && last.meta.name == o.meta.name
                {
                    *last = o;
                    continue;
                }
                out.push(o);
            }
            *v = out;
        }
        norm(&mut c.service_entries);
        norm(&mut c.workload_entries);
        norm(&mut c.virtual_services);
        norm(&mut c.destination_rules);
        norm(&mut c.peer_authentications);
        norm(&mut c.sidecars);
        norm(&mut c.services);
        norm(&mut c.endpoint_slices);
        norm(&mut c.endpoints);
        norm(&mut c.pods);
        norm(&mut c.namespaces);
        c
    }

    /// Total number of objects.
    pub fn len(&self) -> usize {
        self.service_entries.len()
            + self.workload_entries.len()
            + self.virtual_services.len()
            + self.destination_rules.len()
            + self.peer_authentications.len()
            + self.sidecars.len()
            + self.services.len()
            + self.endpoint_slices.len()
            + self.endpoints.len()
            + self.pods.len()
            + self.namespaces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Parses one file's text; `file` is only used in errors. All documents or an error list.
pub fn parse_file(file: &str, text: &str) -> Result<Vec<(Meta, Spec)>, Vec<ConfigError>> {
    use serde::Deserialize;
    // Alias bombs are refused before anything is built (see `expansion`).
    if let Err((doc, reason)) = expansion::check(text) {
        return Err(vec![ConfigError {
            file: file.to_string(),
            doc,
            field: String::new(),
            reason,
        }]);
    }
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (doc, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let err = |field: &str, reason: String| ConfigError {
            file: file.to_string(),
            doc,
            field: field.to_string(),
            reason,
        };
        let value = match serde_yaml::Value::deserialize(de) {
            Ok(v) => v,
            Err(e) => {
                errors.push(err("", format!("not YAML: {e}")));
                // The stream cannot be resynchronised after a syntax error.
                break;
            }
        };
        if value.is_null() {
            continue; // empty document (e.g. a trailing `---`)
        }
        if value.get("kind").and_then(|k| k.as_str()) == Some("List") {
            // kubectl's `kind: List`: each item is an object of its own.
            let Some(items) = value.get("items") else {
                errors.push(err(
                    "items",
                    "missing (a List holds its objects in items)".into(),
                ));
                continue;
            };
            let Some(items) = items.as_sequence() else {
                errors.push(err("items", "not a list".into()));
                continue;
            };
            for (i, item) in items.iter().enumerate() {
                match parse_doc(item) {
                    Ok(obj) => out.push(obj),
                    Err((field, reason)) => {
                        errors.push(err(&format!("items[{i}].{field}"), reason))
                    }
                }
            }
            continue;
        }
        match parse_doc(&value) {
            Ok(obj) => out.push(obj),
            Err((field, reason)) => errors.push(err(&field, reason)),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

type DocError = (String, String);

fn parse_doc(v: &serde_yaml::Value) -> Result<(Meta, Spec), DocError> {
    let map = v
        .as_mapping()
        .ok_or_else(|| ("".to_string(), "document is not a mapping".to_string()))?;
    let get_str =
        |m: &serde_yaml::Mapping, k: &str| m.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let kind = get_str(map, "kind").ok_or_else(|| ("kind".to_string(), "missing".to_string()))?;
    let meta_v = map
        .get("metadata")
        .and_then(|m| m.as_mapping())
        .ok_or_else(|| {
            (
                "metadata".to_string(),
                "missing or not a mapping".to_string(),
            )
        })?;
    let name = get_str(meta_v, "name")
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ("metadata.name".to_string(), "missing".to_string()))?;
    if !is_dns_label_path(&name) {
        return Err((
            "metadata.name".into(),
            format!("{name:?} is not a DNS-1123 name"),
        ));
    }
    let namespace = get_str(meta_v, "namespace").unwrap_or_else(|| "default".to_string());
    let labels: Labels = match meta_v.get("labels") {
        Some(l) => serde_yaml::from_value(l.clone())
            .map_err(|e| ("metadata.labels".to_string(), e.to_string()))?,
        None => Labels::new(),
    };
    let meta = Meta {
        name,
        namespace,
        labels,
    };
    if let Some(want) = kube::api_version(&kind) {
        return parse_kube(v, &kind, want, meta);
    }
    let spec_v = map
        .get("spec")
        .cloned()
        .ok_or_else(|| ("spec".to_string(), "missing".to_string()))?;
    let spec = match kind.as_str() {
        "ServiceEntry" => Spec::ServiceEntry(typed(&spec_v)?),
        "WorkloadEntry" => Spec::WorkloadEntry(typed(&spec_v)?),
        "VirtualService" => Spec::VirtualService(typed(&spec_v)?),
        "DestinationRule" => Spec::DestinationRule(typed(&spec_v)?),
        "PeerAuthentication" => Spec::PeerAuthentication(typed(&spec_v)?),
        "Sidecar" => Spec::Sidecar(typed(&spec_v)?),
        other => {
            return Err((
                "kind".into(),
                format!(
                    "unsupported kind {other:?} (expected ServiceEntry, WorkloadEntry, VirtualService, DestinationRule, PeerAuthentication, Sidecar, Service, EndpointSlice, Endpoints, Pod, Namespace or List)"
                ),
            ));
        }
    };
    validate::spec(&spec).map_err(|(f, r)| (format!("spec.{f}"), r))?;
    Ok((meta, spec))
}

/// A Kubernetes document: `apiVersion` checked, the whole object read (unknown fields ignored).
fn parse_kube(
    v: &serde_yaml::Value,
    kind: &str,
    want: &str,
    meta: Meta,
) -> Result<(Meta, Spec), DocError> {
    let version = v.get("apiVersion").and_then(|a| a.as_str()).unwrap_or("");
    if version != want {
        return Err((
            "apiVersion".into(),
            format!("{version:?} is not {want:?} (the version istiod-lite reads {kind} at)"),
        ));
    }
    let spec = match kind {
        "Service" => Spec::Service(kube::service(typed_at("", v)?)?),
        "EndpointSlice" => Spec::EndpointSlice(kube::endpoint_slice(
            typed_at("", v)?,
            &meta.namespace,
            &meta.labels,
        )?),
        "Endpoints" => Spec::Endpoints(kube::endpoints(
            typed_at("", v)?,
            &meta.name,
            &meta.namespace,
        )?),
        "Pod" => Spec::Pod(kube::pod(typed_at("", v)?, &meta.name)?),
        _ => Spec::Namespace(kube::Namespace {}),
    };
    Ok((meta, spec))
}

/// Deserialises `spec` through a YAML string so that serde_yaml reports the field path.
fn typed<T: serde::de::DeserializeOwned>(v: &serde_yaml::Value) -> Result<T, DocError> {
    typed_at("spec.", v)
}

/// Deserialises `v` (found at `prefix`, e.g. `spec.`) reporting the path of a bad field.
fn typed_at<T: serde::de::DeserializeOwned>(
    prefix: &str,
    v: &serde_yaml::Value,
) -> Result<T, DocError> {
    let whole = prefix.trim_end_matches('.');
    let text = serde_yaml::to_string(v).map_err(|e| (whole.to_string(), e.to_string()))?;
    serde_yaml::from_str(&text).map_err(|e| {
        let msg = e.to_string();
        // serde_yaml prints "path.to.field: reason at line N column M"; split the path off.
        match msg.split_once(": ") {
            Some((path, reason)) if !path.contains(' ') => {
                (format!("{prefix}{path}"), reason.to_string())
            }
            _ => (whole.to_string(), msg),
        }
    })
}

fn is_dns_label_path(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Reads every `*.yaml`/`*.yml` file under `dir` (recursively), sorted by path.
pub fn list_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let path = entry.path();
            let ft = entry.file_type()?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') {
                continue; // editors' swap files, ..data links
            }
            if ft.is_dir() {
                stack.push(path);
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The config directory's state: the last good objects of each file and the current errors.
#[derive(Default, Debug)]
pub struct Store {
    files: BTreeMap<PathBuf, Vec<(Meta, Spec)>>,
    errors: Vec<ConfigError>,
}

impl Store {
    /// Re-reads `dir`. Files that fail keep their last good contents; deleted files drop out.
    pub fn reload(&mut self, dir: &Path) -> Config {
        let mut errors = Vec::new();
        let files = match list_files(dir) {
            Ok(f) => f,
            Err(e) => {
                errors.push(ConfigError {
                    file: dir.display().to_string(),
                    doc: 0,
                    field: "".into(),
                    reason: format!("cannot list directory: {e}"),
                });
                self.errors = errors;
                return self.config();
            }
        };
        self.files.retain(|p, _| files.contains(p));
        for path in files {
            let shown = path.display().to_string();
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    errors.push(ConfigError {
                        file: shown,
                        doc: 0,
                        field: "".into(),
                        reason: format!("unreadable: {e}"),
                    });
                    continue;
                }
            };
            match parse_file(&shown, &text) {
                Ok(objs) => {
                    self.files.insert(path, objs);
                }
                Err(errs) => {
                    for e in &errs {
                        tracing::warn!(file = %e.file, doc = e.doc, field = %e.field, reason = %e.reason,
                            "config document rejected; the file's last good config stays in force");
                    }
                    errors.extend(errs);
                }
            }
        }
        self.errors = errors;
        self.config()
    }

    pub fn config(&self) -> Config {
        Config::from_objects(self.files.values().flatten().cloned())
    }

    pub fn errors(&self) -> &[ConfigError] {
        &self.errors
    }
}

#[cfg(test)]
mod tests;
