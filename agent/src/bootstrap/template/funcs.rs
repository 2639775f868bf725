//! The functions a template can call: Go's built-ins and the sprig/Istio ones Istio registers.

use serde_json::Value;

use super::format::{go_json, go_print, go_quote, go_type, js_escape, print_value, sprintf};

/// Why a function call failed, in Go's words (the template's execution error wraps it as
/// `error calling <name>: ...`). Types are named as Go names them (`<nil>`, `[]interface {}`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum FuncError {
    #[error("function {0:?} not defined")]
    Undefined(String),
    #[error("wrong number of args for {name}: want {want} got {got}")]
    Args {
        name: String,
        want: usize,
        got: usize,
    },
    /// `index` and `printf` without their first operand.
    #[error("wrong number of args for {0}: want at least 1 got 0")]
    NoArgs(&'static str),
    #[error("wrong number of args for default: want 1 or 2 got {0}")]
    DefaultArgs(usize),
    #[error("{what} must be a string, got {got}")]
    NotString {
        what: &'static str,
        got: &'static str,
    },
    #[error("missing argument for comparison")]
    NoComparand,
    #[error("invalid type for comparison: {0}")]
    NotOrdered(&'static str),
    #[error("non-comparable type {0}")]
    NotComparable(&'static str),
    #[error("incompatible types for comparison: {0} and {1}")]
    Incompatible(&'static str, &'static str),
    #[error("len of type {0}")]
    Len(&'static str),
    /// `what`: `slice/array` or `string`; `key`: the number as the template wrote it.
    #[error("cannot index {what} with {key}")]
    IndexNotInt { what: &'static str, key: String },
    #[error("index out of range: {0}")]
    IndexRange(i64),
    #[error("index of untyped nil")]
    IndexNil,
    #[error("cannot index {0} with {1}")]
    IndexType(&'static str, &'static str),
}

fn want(name: &str, vals: &[Value], n: usize) -> Result<(), FuncError> {
    if vals.len() == n {
        Ok(())
    } else {
        Err(FuncError::Args {
            name: name.into(),
            want: n,
            got: vals.len(),
        })
    }
}

fn want_str<'v>(v: &'v Value, what: &'static str) -> Result<&'v str, FuncError> {
    v.as_str().ok_or_else(|| FuncError::NotString {
        what,
        got: go_type(v),
    })
}

/// A function the template names: its family's table row, then the family's own dispatch.
pub(super) fn call_func(name: &str, vals: &[Value]) -> Result<Value, FuncError> {
    type Family = fn(&str, &[Value]) -> Result<Value, FuncError>;
    const FAMILIES: &[(&[&str], Family)] = &[
        (&["not", "empty"], negation),
        (&["eq", "ne", "lt", "le", "gt", "ge"], comparison),
        (&["len"], len),
        (&["index"], index),
        (
            &["print", "js", "html", "urlquery", "println", "printf"],
            printing,
        ),
        (&["toJSON", "toJson", "quote", "squote"], encoding),
        (&["default"], default),
        (&["join", "replace"], joining),
        (
            &[
                "contains",
                "hasPrefix",
                "hasSuffix",
                "trimPrefix",
                "trimSuffix",
            ],
            affix,
        ),
        (&["trim", "upper", "lower", "toString"], case),
    ];
    match FAMILIES.iter().find(|(names, _)| names.contains(&name)) {
        Some((_, family)) => family(name, vals),
        None => Err(FuncError::Undefined(name.into())),
    }
}

/// `not` and sprig's `empty`.
fn negation(name: &str, vals: &[Value]) -> Result<Value, FuncError> {
    want(name, vals, 1)?;
    Ok(Value::Bool(!truth(&vals[0])))
}

/// `eq` (true when the first equals any of the others) and the two-operand comparisons.
fn comparison(name: &str, vals: &[Value]) -> Result<Value, FuncError> {
    use std::cmp::Ordering::*;
    if name == "eq" {
        if vals.len() < 2 {
            return Err(FuncError::NoComparand);
        }
        let mut any = false;
        for other in &vals[1..] {
            any |= compare(&vals[0], other)? == Some(Equal);
        }
        return Ok(Value::Bool(any));
    }
    want(name, vals, 2)?;
    let ord = compare(&vals[0], &vals[1])?;
    if name != "ne" && ord.is_none() {
        return Err(FuncError::NotOrdered(go_type(&vals[0])));
    }
    Ok(Value::Bool(match name {
        "ne" => ord != Some(Equal),
        "lt" => ord == Some(Less),
        "le" => ord != Some(Greater),
        "gt" => ord == Some(Greater),
        _ => ord != Some(Less),
    }))
}

fn len(name: &str, vals: &[Value]) -> Result<Value, FuncError> {
    want(name, vals, 1)?;
    Ok(Value::from(match &vals[0] {
        Value::String(t) => t.len(),
        Value::Array(a) => a.len(),
        Value::Object(m) => m.len(),
        other => return Err(FuncError::Len(go_type(other))),
    }))
}

/// `index x k1 k2 ...`: map members, slice elements and string bytes, one key after another.
fn index(_: &str, vals: &[Value]) -> Result<Value, FuncError> {
    let Some((first, keys)) = vals.split_first() else {
        return Err(FuncError::NoArgs("index"));
    };
    let mut cur = first.clone();
    for k in keys {
        cur = index_one(&cur, k)?;
    }
    Ok(cur)
}

fn index_one(cur: &Value, k: &Value) -> Result<Value, FuncError> {
    Ok(match (cur, k) {
        (Value::Object(m), Value::String(key)) => m.get(key).cloned().unwrap_or(Value::Null),
        (Value::Array(a), Value::Number(n)) => {
            let i = n.as_i64().ok_or_else(|| FuncError::IndexNotInt {
                what: "slice/array",
                key: n.to_string(),
            })?;
            usize::try_from(i)
                .ok()
                .and_then(|i| a.get(i).cloned())
                .ok_or(FuncError::IndexRange(i))?
        }
        (Value::String(t), Value::Number(n)) => {
            let i = n.as_i64().ok_or_else(|| FuncError::IndexNotInt {
                what: "string",
                key: n.to_string(),
            })?;
            usize::try_from(i)
                .ok()
                .and_then(|i| t.as_bytes().get(i).copied())
                .map(Value::from)
                .ok_or(FuncError::IndexRange(i))?
        }
        (Value::Null, _) => return Err(FuncError::IndexNil),
        (c, k) => return Err(FuncError::IndexType(go_type(c), go_type(k))),
    })
}

/// Go's `print`, `println`, `printf` and the escapers that print their operands first.
fn printing(name: &str, vals: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::String(match name {
        "print" => sprint(vals),
        "js" => js_escape(&sprint(vals)),
        "html" => html_escape(&sprint(vals)),
        "urlquery" => query_escape(&sprint(vals)),
        "println" => {
            let parts: Vec<String> = vals.iter().map(go_print).collect();
            parts.join(" ") + "\n"
        }
        _ => {
            let Some((fmt, rest)) = vals.split_first() else {
                return Err(FuncError::NoArgs("printf"));
            };
            sprintf(want_str(fmt, "format")?, rest)
        }
    }))
}

/// Istio's `toJSON` (nil as `{}`), sprig's `toJson`, `quote` and `squote`.
fn encoding(name: &str, vals: &[Value]) -> Result<Value, FuncError> {
    if name == "quote" || name == "squote" {
        let parts: Vec<String> = vals
            .iter()
            .filter(|v| !v.is_null())
            .map(|v| {
                let t = go_print(v);
                if name == "quote" {
                    go_quote(&t)
                } else {
                    format!("'{t}'")
                }
            })
            .collect();
        return Ok(Value::String(parts.join(" ")));
    }
    want(name, vals, 1)?;
    Ok(Value::String(if name == "toJSON" && vals[0].is_null() {
        "{}".into()
    } else {
        go_json(&vals[0])
    }))
}

/// sprig's `default d v`: `v` when it is true in Go's sense, else `d`.
fn default(_: &str, vals: &[Value]) -> Result<Value, FuncError> {
    if vals.is_empty() || vals.len() > 2 {
        return Err(FuncError::DefaultArgs(vals.len()));
    }
    Ok(match vals.get(1) {
        Some(v) if truth(v) => v.clone(),
        _ => vals[0].clone(),
    })
}

/// sprig's `join sep list` and `replace old new s`.
fn joining(name: &str, vals: &[Value]) -> Result<Value, FuncError> {
    if name == "replace" {
        want(name, vals, 3)?;
        return Ok(Value::String(
            go_print(&vals[2]).replace(&go_print(&vals[0]), &go_print(&vals[1])),
        ));
    }
    want(name, vals, 2)?;
    let sep = go_print(&vals[0]);
    let parts: Vec<String> = match &vals[1] {
        Value::Array(a) => a.iter().filter(|v| !v.is_null()).map(go_print).collect(),
        Value::Null => Vec::new(),
        other => vec![go_print(other)],
    };
    Ok(Value::String(parts.join(&sep)))
}

/// sprig's `contains`, `hasPrefix`, `hasSuffix`, `trimPrefix`, `trimSuffix` (needle first).
fn affix(name: &str, vals: &[Value]) -> Result<Value, FuncError> {
    want(name, vals, 2)?;
    let needle = go_print(&vals[0]);
    let hay = go_print(&vals[1]);
    let s = |t: &str| Value::String(t.to_string());
    Ok(match name {
        "contains" => Value::Bool(hay.contains(&needle)),
        "hasPrefix" => Value::Bool(hay.starts_with(&needle)),
        "hasSuffix" => Value::Bool(hay.ends_with(&needle)),
        "trimPrefix" => s(hay.strip_prefix(needle.as_str()).unwrap_or(&hay)),
        _ => s(hay.strip_suffix(needle.as_str()).unwrap_or(&hay)),
    })
}

/// sprig's `trim`, `upper`, `lower`, `toString`.
fn case(name: &str, vals: &[Value]) -> Result<Value, FuncError> {
    want(name, vals, 1)?;
    let t = go_print(&vals[0]);
    Ok(Value::String(match name {
        "trim" => t.trim().to_string(),
        "upper" => t.to_uppercase(),
        "lower" => t.to_lowercase(),
        _ => t,
    }))
}

/// Go's truthiness: false, 0, "", nil and empty lists/maps are false.
pub fn truth(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
    }
}

fn compare(a: &Value, b: &Value) -> Result<Option<std::cmp::Ordering>, FuncError> {
    Ok(match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => Some(x.cmp(&y)),
            _ => x
                .as_f64()
                .zip(y.as_f64())
                .and_then(|(x, y)| x.partial_cmp(&y)),
        },
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => (x == y).then_some(std::cmp::Ordering::Equal),
        (Value::Null, Value::Null) => Some(std::cmp::Ordering::Equal),
        (Value::Null, _) | (_, Value::Null) => None,
        (Value::Array(_) | Value::Object(_), _) | (_, Value::Array(_) | Value::Object(_)) => {
            return Err(FuncError::NotComparable(go_type(
                if a.is_array() || a.is_object() { a } else { b },
            )));
        }
        _ => return Err(FuncError::Incompatible(go_type(a), go_type(b))),
    })
}

/// Go's `fmt.Sprint`: spaces between operands when neither is a string.
fn sprint(vals: &[Value]) -> String {
    let mut out = String::new();
    for (i, v) in vals.iter().enumerate() {
        if i > 0 && !vals[i - 1].is_string() && !v.is_string() {
            out.push(' ');
        }
        print_value(&mut out, v, false);
    }
    out
}

/// Go's `template.HTMLEscapeString`.
fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\0' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// Go's `url.QueryEscape` (the `urlquery` function).
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
