//! JSON read the way Go's `encoding/json` reads it into a struct: object keys match field
//! names case-insensitively (Go's folding: ASCII case, plus Unicode simple folding such as the
//! Kelvin sign and the long s), unknown keys are ignored, a later key for the same field wins
//! (objects decoded into the same field merge), and `null` leaves a field at its zero value.
//! Istio's agent decodes `ISTIO_KUBE_APP_PROBERS` this way, so `gRPC` or `HTTPGET` are valid.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value with object keys kept in document order.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// An integer literal (no fraction, no exponent).
    Int(i128),
    /// A number literal with a fraction or an exponent.
    Float(f64),
    String(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

impl Value {
    /// What the value is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) | Value::Float(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        }
    }
}

/// Parses `text` as one JSON value.
pub fn parse(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = de.deserialize_any(ValueVisitor)?;
    de.end()?;
    Ok(v)
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Seed)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            out.push((k, map.next_value_seed(Seed)?));
        }
        Ok(Value::Object(out))
    }
}

struct Seed;

impl<'de> de::DeserializeSeed<'de> for Seed {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

/// Go's key folding: ASCII upper case; other characters `ToUpper(ToLower(c))`.
fn fold(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii() {
                c.to_ascii_uppercase()
            } else {
                let lower = c.to_lowercase().next().unwrap_or(c);
                lower.to_uppercase().next().unwrap_or(lower)
            }
        })
        .collect()
}

/// The value of struct field `name` in `object`, as Go would decode it: the last matching key
/// wins, `null` resets the field, objects under several matching keys merge.
pub fn field(object: &[(String, Value)], name: &str) -> Option<Value> {
    let want = fold(name);
    let mut out: Option<Value> = None;
    for (k, v) in object {
        if fold(k) != want {
            continue;
        }
        out = match (out, v) {
            (_, Value::Null) => None,
            (Some(Value::Object(mut a)), Value::Object(b)) => {
                a.extend(b.iter().cloned());
                Some(Value::Object(a))
            }
            (_, v) => Some(v.clone()),
        };
    }
    out
}

/// A field whose value has another type than the one Go decodes it into.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{name}: {expected}, not {got}")]
pub struct FieldError {
    pub name: String,
    pub expected: &'static str,
    /// The value's kind or, for a number, the value.
    pub got: String,
}

/// A string field: absent or `null` is empty.
pub fn string(object: &[(String, Value)], name: &str) -> Result<String, FieldError> {
    match field(object, name) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(FieldError {
            name: name.to_string(),
            expected: "a string",
            got: v.kind().to_string(),
        }),
    }
}

/// An `int32` field: absent or `null` is 0; fractions, exponents and out-of-range values are
/// errors (Go refuses `8080.0` for an integer).
pub fn int32(object: &[(String, Value)], name: &str) -> Result<i32, FieldError> {
    match field(object, name) {
        None => Ok(0),
        Some(v) => as_int32(&v).ok_or_else(|| FieldError {
            name: name.to_string(),
            expected: "a 32-bit integer",
            got: format!("{v:?}"),
        }),
    }
}

/// An integer literal in `int32` range.
pub fn as_int32(v: &Value) -> Option<i32> {
    match v {
        Value::Int(i) => i32::try_from(*i).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fold_as_go_folds_them() {
        let Value::Object(o) =
            parse(r#"{"GRPC":{"port":1},"tcpSoc\u212Aet":2,"timeout\u017Feconds":3,"unknown":4}"#)
                .unwrap()
        else {
            panic!("object")
        };
        assert!(matches!(field(&o, "grpc"), Some(Value::Object(_))));
        // The Kelvin sign folds to k, the long s to s, as in Go.
        assert_eq!(field(&o, "tcpSocket"), Some(Value::Int(2)));
        assert_eq!(int32(&o, "timeoutSeconds"), Ok(3));
        assert_eq!(field(&o, "httpGet"), None);
    }

    #[test]
    fn later_keys_win_nulls_reset_objects_merge() {
        let Value::Object(o) = parse(
            r#"{"path":"/a","PATH":"/b","httpGet":{"path":"/x"},"HTTPGET":{"port":1},
                "grpc":{"port":1},"gRPC":null,"t":1.0,"big":3000000000}"#,
        )
        .unwrap() else {
            panic!("object")
        };
        assert_eq!(string(&o, "path"), Ok("/b".into()));
        let Some(Value::Object(h)) = field(&o, "httpGet") else {
            panic!("merged object")
        };
        assert_eq!(
            (string(&h, "path"), int32(&h, "port")),
            (Ok("/x".into()), Ok(1))
        );
        assert_eq!(field(&o, "grpc"), None);
        assert!(int32(&o, "t").is_err(), "1.0 is not an int32 literal");
        assert!(int32(&o, "big").is_err(), "out of int32 range");
        assert!(string(&o, "big").is_err());
    }
}
