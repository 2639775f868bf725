//! Go's formatting of values: `fmt`'s `%v`, `strconv.Quote`, `encoding/json` and `js` escaping.

use std::fmt::Write as _;

use serde_json::Value;

/// Go's `%v`.
pub(super) fn go_print(v: &Value) -> String {
    let mut s = String::new();
    print_value(&mut s, v, false);
    s
}

/// Writes `v` as Go's fmt prints it; a top-level nil is `<no value>` (text/template) and a nested
/// one `<nil>`.
pub(super) fn print_value(out: &mut String, v: &Value, top: bool) {
    match v {
        Value::Null if top => out.push_str("<no value>"),
        Value::Null => out.push_str("<nil>"),
        Value::Bool(b) => {
            let _ = write!(out, "{b}");
        }
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else {
                let f = n.as_f64().unwrap_or(0.0);
                if f != 0.0 && (f.abs() >= 1e21 || f.abs() < 1e-4) {
                    let _ = write!(out, "{f:e}");
                } else {
                    let _ = write!(out, "{f}");
                }
            }
        }
        Value::String(s) => out.push_str(s),
        Value::Array(a) => {
            out.push('[');
            for (i, e) in a.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                print_value(out, e, false);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push_str("map[");
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for (i, (k, e)) in keys.into_iter().map(|k| (k, &m[k])).enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(k);
                out.push(':');
                print_value(out, e, false);
            }
            out.push(']');
        }
    }
}

/// Go's `json.Marshal` of a decoded JSON value: map keys sorted, numbers as Go prints a
/// `float64` (`1`, not `1.0`; exponent form below 1e-6 and from 1e21), and strings with Go's
/// escapes (`<`, `>`, `&`, U+2028 and U+2029 as `\u003c` etc.).
pub(super) fn go_json(v: &Value) -> String {
    let mut out = String::new();
    write_json(&mut out, v);
    out
}

fn write_json(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => {
            let _ = write!(out, "{b}");
        }
        Value::Number(n) => write_json_number(out, n),
        Value::String(s) => write_json_string(out, s),
        Value::Array(a) => {
            out.push('[');
            for (i, e) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(out, e);
            }
            out.push(']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json_string(out, k);
                out.push(':');
                write_json(out, &m[k]);
            }
            out.push('}');
        }
    }
}

fn write_json_number(out: &mut String, n: &serde_json::Number) {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
        return;
    }
    if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
        return;
    }
    let f = n.as_f64().unwrap_or(0.0);
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Go: `1e+21`, `1e-07` (at least two exponent digits).
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        let _ = write!(out, "{mant}e{sign}{digits:0>2}");
    } else if f.fract() == 0.0 && abs < 1e21 {
        let _ = write!(out, "{f:.0}");
    } else {
        let _ = write!(out, "{f}");
    }
}

fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Go's `unicode.IsPrint` for non-ASCII characters, closely enough: not a control, separator
/// (space, line, paragraph) or format character.
fn go_is_print(c: char) -> bool {
    !(c.is_control()
        || c.is_whitespace()
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{feff}'))
}

/// Go's `template.JSEscapeString` (the `js` function): `\\ ' "` backslash-escaped, `< > & =`
/// as `\u003C` etc. (upper-case hex), other control characters as `\u00XX`, non-printable
/// non-ASCII as `\uXXXX`; printable text is kept.
pub(super) fn js_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '"' => out.push_str("\\\""),
            '<' | '>' | '&' | '=' => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c if !c.is_ascii() && !go_is_print(c) => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Go's `strconv.Quote`.
pub(super) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\x7f' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `fmt.Sprintf` for `%s %v %d %q %t %f %x %%` (flags and widths are kept verbatim in the
/// error form rather than interpreted).
pub(super) fn sprintf(fmt: &str, args: &[Value]) -> String {
    let mut out = String::new();
    let mut args = args.iter();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(verb) = chars.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        let Some(arg) = args.next() else {
            let _ = write!(out, "%!{verb}(MISSING)");
            continue;
        };
        match (verb, arg) {
            ('s' | 'v', v) => print_value(&mut out, v, false),
            ('d', Value::Number(n)) if n.as_i64().is_some() || n.as_u64().is_some() => {
                print_value(&mut out, arg, false)
            }
            ('q', Value::String(t)) => out.push_str(&go_quote(t)),
            ('t', Value::Bool(b)) => {
                let _ = write!(out, "{b}");
            }
            ('f', Value::Number(n)) => {
                let _ = write!(out, "{:.6}", n.as_f64().unwrap_or(0.0));
            }
            ('x', Value::Number(n)) if n.as_i64().is_some() => {
                let _ = write!(out, "{:x}", n.as_i64().unwrap_or(0));
            }
            ('x', Value::String(t)) => {
                for b in t.bytes() {
                    let _ = write!(out, "{b:02x}");
                }
            }
            (verb, v) => {
                let _ = write!(out, "%!{verb}({}={})", go_type(v), go_print(v));
            }
        }
    }
    let extra: Vec<String> = args
        .map(|v| format!("{}={}", go_type(v), go_print(v)))
        .collect();
    if !extra.is_empty() {
        let _ = write!(out, "%!(EXTRA {})", extra.join(", "));
    }
    out
}

/// The Go type name of a value, for error messages.
pub(super) fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float64",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}
