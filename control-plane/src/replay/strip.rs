//! `--strip-istio-extensions`: removes from a resource everything only Istio's Envoy build
//! (istio/proxy) implements, wherever it appears.
//!
//! Decided by type URL against an allow-list of upstream packages (`envoy.config.`,
//! `envoy.extensions.`, ... and the `google.protobuf.` / `xds.` helpers) rather than a list of
//! known Istio names, so that extensions of a newer Istio are caught too. A TypedStruct
//! (`udpa.type.v1` or `xds.type.v3`) counts as the type it wraps. Null-VM Wasm filters count as
//! Istio-only as well: upstream Envoy compiles no null-VM plugin in
//! (`envoy.wasm.metadata_exchange` and friends live in Istio's build).
//!
//! What is removed is the smallest enclosing entry: an element of any list (HTTP/network/
//! listener filters, a cluster's `filters`, access logs, ...), or a field of any object whose
//! value is such an extension (`typed_per_filter_config` entries, `transport_socket`, a bare
//! `Any`).

use serde_json::{Map, Value};

const TYPE_PREFIX: &str = "type.googleapis.com/";

/// Packages of types upstream Envoy knows. `envoy.tcp.metadataexchange.` (Istio's) is not one.
const UPSTREAM: [&str; 10] = [
    "envoy.config.",
    "envoy.extensions.",
    "envoy.type.",
    "envoy.service.",
    "envoy.admin.",
    "envoy.data.",
    "envoy.watchdog.",
    "google.protobuf.",
    "xds.",
    "udpa.",
];

const TYPED_STRUCTS: [&str; 2] = ["udpa.type.v1.TypedStruct", "xds.type.v3.TypedStruct"];

const WASM: [&str; 2] = [
    "envoy.extensions.filters.http.wasm.v3.Wasm",
    "envoy.extensions.filters.network.wasm.v3.Wasm",
];

/// One removed extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    /// `listener virtualInbound`, `cluster outbound|80||a.b`, ...
    pub resource: String,
    /// Path inside the resource, e.g. `filter_chains[2].filters[0]`.
    pub path: String,
    /// The entry's `name`, when it has one (`istio.stats`).
    pub name: Option<String>,
    /// The type that made it Istio-only (the wrapped one for a TypedStruct).
    pub type_url: String,
}

impl std::fmt::Display for Removal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.resource, self.path)?;
        if let Some(n) = &self.name {
            write!(f, " ({n})")?;
        }
        write!(f, ": {}", self.type_url)
    }
}

fn bare(type_url: &str) -> &str {
    type_url.strip_prefix(TYPE_PREFIX).unwrap_or(type_url)
}

/// Whether upstream Envoy knows `type_url` (with or without the `type.googleapis.com/`).
pub(super) fn is_upstream(type_url: &str) -> bool {
    let t = bare(type_url);
    UPSTREAM.iter().any(|p| t.starts_with(p))
}

/// The type an `Any` in JSON form stands for: its `@type`, or a TypedStruct's `type_url`.
fn effective_type(any: &Map<String, Value>) -> Option<String> {
    let t = any.get("@type")?.as_str()?;
    if TYPED_STRUCTS.contains(&bare(t)) {
        let inner = any.get("type_url").and_then(Value::as_str).unwrap_or(t);
        return Some(inner.to_string());
    }
    Some(t.to_string())
}

/// Why `v` exists only in Istio's build, if it does: the offending type.
fn istio_only(v: &Value) -> Option<String> {
    let obj = v.as_object()?;
    if let Some(t) = effective_type(obj) {
        return (!is_upstream(&t)).then_some(t);
    }
    let cfg = obj.get("typed_config")?.as_object()?;
    let t = effective_type(cfg)?;
    if !is_upstream(&t) {
        return Some(t);
    }
    if WASM.contains(&bare(&t)) {
        let vm = cfg.get("config").and_then(|c| c.get("vm_config"));
        let runtime = vm.and_then(|vm| vm.get("runtime")).and_then(Value::as_str);
        if runtime == Some("envoy.wasm.runtime.null") {
            let plugin = vm
                .and_then(|vm| vm.pointer("/code/local/inline_string"))
                .and_then(Value::as_str)
                .unwrap_or("?");
            return Some(format!("{t} (null-VM plugin {plugin})"));
        }
    }
    None
}

/// Removes every Istio-only extension inside `resource` (never `resource` itself).
pub(super) fn strip(resource: &mut Value, label: &str) -> Vec<Removal> {
    let mut out = Vec::new();
    walk(resource, &mut String::new(), label, &mut out);
    out
}

fn name_of(v: &Value) -> Option<String> {
    v.get("name").and_then(Value::as_str).map(str::to_string)
}

fn walk(v: &mut Value, path: &mut String, label: &str, out: &mut Vec<Removal>) {
    let len = path.len();
    match v {
        Value::Array(items) => {
            let mut i = 0usize;
            let mut index = 0usize;
            while i < items.len() {
                path.push_str(&format!("[{index}]"));
                if let Some(t) = istio_only(&items[i]) {
                    out.push(Removal {
                        resource: label.to_string(),
                        path: path.clone(),
                        name: name_of(&items[i]),
                        type_url: t,
                    });
                    items.remove(i);
                } else {
                    walk(&mut items[i], path, label, out);
                    i += 1;
                }
                path.truncate(len);
                index += 1;
            }
        }
        Value::Object(fields) => {
            let keys: Vec<String> = fields.keys().cloned().collect();
            for k in keys {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&k);
                let remove = fields.get(&k).and_then(istio_only);
                if let Some(t) = remove {
                    let name = fields.get(&k).and_then(name_of).or_else(|| {
                        // A `typed_per_filter_config` entry is named by its key.
                        path.ends_with(&format!("typed_per_filter_config.{k}"))
                            .then(|| k.clone())
                    });
                    out.push(Removal {
                        resource: label.to_string(),
                        path: path.clone(),
                        name,
                        type_url: t,
                    });
                    fields.remove(&k);
                } else if let Some(child) = fields.get_mut(&k) {
                    walk(child, path, label, out);
                }
                path.truncate(len);
            }
        }
        _ => {}
    }
}
