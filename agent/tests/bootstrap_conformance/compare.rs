//! JSON comparison under Envoy's proto rules (the corpus README's step 3): object key order
//! never matters, list order does, a field at its proto default equals an absent one,
//! durations compare by value, 64-bit integers may be strings or numbers. Inside
//! `google.protobuf.Struct` values (node metadata, runtime layers, `TypedStruct` values) every
//! key counts and numbers are doubles.

use serde_json::{Map, Value};

/// Whether `v` is a proto default (absent-equivalent) outside a Struct.
fn is_default(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty() || duration_nanos(s) == Some(0),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
    }
}

/// `"0.250s"` → 250_000_000; `None` unless a proto-JSON duration.
fn duration_nanos(s: &str) -> Option<i128> {
    let body = s.strip_suffix('s')?;
    let (neg, body) = match body.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, body),
    };
    let (whole, frac) = body.split_once('.').unwrap_or((body, ""));
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 9
    {
        return None;
    }
    let nanos =
        whole.parse::<i128>().ok()? * 1_000_000_000 + format!("{frac:0<9}").parse::<i128>().ok()?;
    Some(if neg { -nanos } else { nanos })
}

fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 160 {
        format!("{}...", &s[..160])
    } else {
        s
    }
}

/// Compares `expected` with `got`; every difference is pushed to `diffs` as
/// `path: expected .. got ..`.
pub fn compare(path: &str, expected: &Value, got: &Value, diffs: &mut Vec<String>) {
    walk(path, expected, got, false, diffs);
}

fn walk(path: &str, e: &Value, g: &Value, in_struct: bool, diffs: &mut Vec<String>) {
    let differ = |diffs: &mut Vec<String>| {
        diffs.push(format!(
            "{}: expected {} got {}",
            if path.is_empty() { "." } else { path },
            show(e),
            show(g)
        ))
    };
    match (e, g) {
        (Value::Object(em), Value::Object(gm)) => objects(path, em, gm, in_struct, diffs),
        (Value::Array(ea), Value::Array(ga)) => {
            if ea.len() != ga.len() {
                diffs.push(format!(
                    "{path}: expected {} items got {}: expected {} got {}",
                    ea.len(),
                    ga.len(),
                    show(e),
                    show(g)
                ));
                return;
            }
            for (i, (x, y)) in ea.iter().zip(ga).enumerate() {
                walk(&format!("{path}[{i}]"), x, y, in_struct, diffs);
            }
        }
        (Value::Number(x), Value::Number(y)) => {
            if x.as_f64() != y.as_f64() {
                differ(diffs)
            }
        }
        (Value::String(x), Value::String(y)) => {
            let same = x == y
                || (!in_struct
                    && duration_nanos(x).is_some()
                    && duration_nanos(x) == duration_nanos(y));
            if !same {
                differ(diffs)
            }
        }
        // 64-bit integers: proto JSON writes them as strings or numbers.
        (Value::String(s), Value::Number(n)) | (Value::Number(n), Value::String(s))
            if !in_struct =>
        {
            if s.parse::<f64>().ok() != n.as_f64() {
                differ(diffs)
            }
        }
        _ if !in_struct && is_default(e) && is_default(g) => {}
        _ => {
            if e != g {
                differ(diffs)
            }
        }
    }
}

fn objects(
    path: &str,
    e: &Map<String, Value>,
    g: &Map<String, Value>,
    in_struct: bool,
    diffs: &mut Vec<String>,
) {
    let typed_struct = e
        .get("@type")
        .and_then(Value::as_str)
        .is_some_and(|t| t.ends_with("udpa.type.v1.TypedStruct"));
    let mut keys: Vec<&String> = e.keys().chain(g.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let sub = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        // Struct-valued fields: node metadata, runtime layers, TypedStruct values.
        let child_struct = in_struct
            || (k == "metadata" && path == "node")
            || k == "static_layer"
            || (typed_struct && k == "value");
        match (e.get(k), g.get(k)) {
            (Some(x), Some(y)) => walk(&sub, x, y, child_struct, diffs),
            (Some(x), None) if in_struct || !is_default(x) => {
                diffs.push(format!("{sub}: expected {} got nothing", show(x)))
            }
            (None, Some(y)) if in_struct || !is_default(y) => {
                diffs.push(format!("{sub}: expected nothing got {}", show(y)))
            }
            _ => {}
        }
    }
}

#[test]
fn comparator_follows_proto_rules() {
    let mut d = Vec::new();
    compare(
        "",
        &serde_json::json!({"a": {"t": "0.250s", "n": 1, "z": false, "l": {}}, "m": 5}),
        &serde_json::json!({"m": "5", "a": {"n": 1.0, "t": "0.25s"}}),
        &mut d,
    );
    assert!(d.is_empty(), "{d:?}");
    compare(
        "",
        &serde_json::json!({"node": {"metadata": {"A": false, "P": 15090}}, "x": [1, 2]}),
        &serde_json::json!({"node": {"metadata": {"P": "15090"}}, "x": [2, 1]}),
        &mut d,
    );
    assert_eq!(
        d,
        [
            "node.metadata.A: expected false got nothing",
            "node.metadata.P: expected 15090 got \"15090\"",
            "x[0]: expected 1 got 2",
            "x[1]: expected 2 got 1",
        ]
    );
}
