//! The opt-in heap bound (`ENVOY_MEMORY_OVERLOAD`, not in Istio): an overload manager fragment
//! merged into the bootstrap (Envoy's `--config-yaml`, so it joins the resource monitor Istio's
//! bootstrap already has, from the built-in bootstrap and a template alike).

use serde_json::{Value, json};

use crate::config::HeapLimit;

/// Heap pressure at which Envoy gives freed memory back to the system.
pub const SHRINK_HEAP_AT: f64 = 0.90;
/// Heap pressure at which Envoy stops accepting new connections.
pub const STOP_ACCEPTING_AT: f64 = 0.95;

/// The overload manager fragment for `limit`: a fixed-heap monitor and two actions, and its
/// stats kept.
pub fn heap_fragment(limit: &HeapLimit) -> Value {
    let trigger = |value: f64| json!([{ "name": "envoy.resource_monitors.fixed_heap", "threshold": { "value": value } }]);
    json!({
        // Istio's stats matcher keeps an inclusion list: the pressure and the actions' state
        // are added to it, so the bound can be watched.
        "stats_config": {
            "stats_matcher": { "inclusion_list": { "patterns": [{ "prefix": "overload." }] } }
        },
        "overload_manager": {
            "refresh_interval": "0.25s",
            "resource_monitors": [{
                "name": "envoy.resource_monitors.fixed_heap",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig",
                    "max_heap_size_bytes": limit.max_heap_bytes.to_string()
                }
            }],
            "actions": [
                { "name": "envoy.overload_actions.shrink_heap", "triggers": trigger(SHRINK_HEAP_AT) },
                {
                    "name": "envoy.overload_actions.stop_accepting_connections",
                    "triggers": trigger(STOP_ACCEPTING_AT)
                }
            ]
        }
    })
}

/// Merges `from` into `into` as protobuf merges a message: objects field by field, lists
/// appended, anything else replaced (what Envoy does with `--config-yaml`).
pub fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(&k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        a.insert(k, v);
                    }
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => a.extend(b),
        (slot, v) => *slot = v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragment_and_merge() {
        let limit = HeapLimit {
            container_bytes: 1000 << 20,
            source: "cgroup",
            max_heap_bytes: 850 << 20,
        };
        let f = heap_fragment(&limit);
        let om = &f["overload_manager"];
        assert_eq!(
            om["resource_monitors"][0]["typed_config"]["max_heap_size_bytes"],
            (850u64 << 20).to_string()
        );
        assert_eq!(om["actions"][1]["triggers"][0]["threshold"]["value"], 0.95);
        // A bootstrap override is merged after: its own monitors are appended, scalars win.
        let mut merged = f.clone();
        merge(
            &mut merged,
            json!({ "overload_manager": { "refresh_interval": "1s", "resource_monitors": [{ "name": "x" }] },
                    "admin": { "address": "a" } }),
        );
        assert_eq!(merged["overload_manager"]["refresh_interval"], "1s");
        assert_eq!(
            merged["overload_manager"]["resource_monitors"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(merged["admin"]["address"], "a");
    }
}
