//! Go's value syntax, as Istio's flags, environment variables and ProxyConfig use it: durations
//! (`time.ParseDuration`), booleans (`strconv.ParseBool`) and double-quoted strings
//! (`strconv.Unquote`). The one reader every crate uses, so that `SECRET_TTL`,
//! `DNS_FORWARD_TIMEOUT`, `drainDuration` or istiod-lite's `--ttl` accept exactly the same text.
//!
//! The text Istio's Go binaries write, shared the same way: RFC 3339 times ([`timestamp`]) and
//! `pkg/log`'s line layout ([`istio_log`]), so `pilot-agent` and `istio-iptables` log alike.
//!
//! Durations are non-negative here: a negative one is an error, since no setting the mesh reads
//! means anything below zero. Bounds beyond that (at least 1s, more than 0) are the caller's.

#![forbid(unsafe_code)]

pub mod istio_log;
pub mod timestamp;

use std::time::Duration;

/// Why a value is not Go syntax. The caller names the setting; this says what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyntaxError {
    #[error("empty")]
    Empty,
    #[error("missing unit (ns, us, ms, s, m or h)")]
    MissingUnit,
    #[error("unknown unit {0:?} (ns, us, ms, s, m or h)")]
    UnknownUnit(String),
    #[error("negative")]
    Negative,
    #[error("too large")]
    Overflow,
    #[error("not a number")]
    NotANumber,
    #[error("not a boolean (true, false, 1, 0, t, f)")]
    NotABool,
}

/// What a duration setting expects, for error messages.
pub const DURATION_EXPECTED: &str = "a Go duration such as 24h, 1m30s, 10s or 100ms";

/// Go's `time.ParseDuration`, non-negative: `0`, `+5s`, `1.5h`, `.5s`, `1h30m`, `100ms`, `10us`
/// (also `µs` and `μs`), `5ns`; at most `i64::MAX` nanoseconds. The arithmetic is Go's (an
/// integer part, then the fraction scaled through a float), so results agree with Go's to the
/// nanosecond.
pub fn parse_duration(s: &str) -> Result<Duration, SyntaxError> {
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    if body.is_empty() {
        return Err(SyntaxError::Empty);
    }
    let mut total: u64 = 0;
    let mut rest = body;
    while !rest.is_empty() {
        let (v, tail) = duration_part(rest)?;
        total = total
            .checked_add(v)
            .filter(|t| *t <= LIMIT)
            .ok_or(SyntaxError::Overflow)?;
        rest = tail;
    }
    if negative && total > 0 {
        return Err(SyntaxError::Negative);
    }
    if total > LIMIT - 1 {
        return Err(SyntaxError::Overflow);
    }
    Ok(Duration::from_nanos(total))
}

/// The bound of a duration's nanoseconds while it is read (one past `i64::MAX`).
const LIMIT: u64 = 1 << 63;

/// One `<number><unit>` at the start of `rest`: its nanoseconds and what follows it.
fn duration_part(rest: &str) -> Result<(u64, &str), SyntaxError> {
    let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (int, tail) = rest.split_at(int_len);
    let (frac, tail) = match tail.strip_prefix('.') {
        Some(t) => t.split_at(t.bytes().take_while(u8::is_ascii_digit).count()),
        None => ("", tail),
    };
    if int.is_empty() && frac.is_empty() {
        return Err(SyntaxError::NotANumber);
    }
    let unit_len = tail
        .find(|c: char| c.is_ascii_digit() || c == '.')
        .unwrap_or(tail.len());
    let (unit, tail) = tail.split_at(unit_len);
    let unit: u64 = match unit {
        "" => return Err(SyntaxError::MissingUnit),
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        other => return Err(SyntaxError::UnknownUnit(other.to_string())),
    };
    let mut v: u64 = 0;
    for d in int.bytes() {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(d - b'0')))
            .filter(|v| *v <= LIMIT)
            .ok_or(SyntaxError::Overflow)?;
    }
    // The fraction's digits as an integer and its scale; digits past what fits are dropped.
    let (mut f, mut scale) = (0u64, 1f64);
    for d in frac.bytes() {
        match f.checked_mul(10).map(|x| x + u64::from(d - b'0')) {
            Some(y) if f <= (LIMIT - 1) / 10 && y <= LIMIT => {
                f = y;
                scale *= 10.0;
            }
            _ => break,
        }
    }
    if v > LIMIT / unit {
        return Err(SyntaxError::Overflow);
    }
    v *= unit;
    if f > 0 {
        v += (f as f64 * (unit as f64 / scale)) as u64;
        if v > LIMIT {
            return Err(SyntaxError::Overflow);
        }
    }
    Ok((v, tail))
}

/// Go's own `time.ParseDuration` cases (non-negative ones; a negative or invalid text expects
/// `None`): the one table every crate's duration settings are tested against.
pub const DURATION_CASES: &[(&str, Option<u64>)] = &[
    ("0", Some(0)),
    ("5s", Some(5_000_000_000)),
    ("30s", Some(30_000_000_000)),
    ("1478s", Some(1_478_000_000_000)),
    ("-5s", None),
    ("+5s", Some(5_000_000_000)),
    ("-0", Some(0)),
    ("+0", Some(0)),
    ("5.0s", Some(5_000_000_000)),
    ("5.6s", Some(5_600_000_000)),
    ("5.s", Some(5_000_000_000)),
    (".5s", Some(500_000_000)),
    ("1.0s", Some(1_000_000_000)),
    ("1.004s", Some(1_004_000_000)),
    ("100.00100s", Some(100_001_000_000)),
    ("10ns", Some(10)),
    ("11us", Some(11_000)),
    ("12\u{b5}s", Some(12_000)),
    ("12\u{3bc}s", Some(12_000)),
    ("13ms", Some(13_000_000)),
    ("15m", Some(900_000_000_000)),
    ("16h", Some(57_600_000_000_000)),
    ("3h30m", Some(12_600_000_000_000)),
    ("10.5s4m", Some(250_500_000_000)),
    ("1h2m3s4ms5us6ns", Some(3_723_004_005_006)),
    ("39h9m14.425s", Some(140_954_425_000_000)),
    ("52763797000ns", Some(52_763_797_000)),
    ("0.3333333333333333333h", Some(1_200_000_000_000)),
    ("9007199254740993ns", Some(9_007_199_254_740_993)),
    ("9223372036854775807ns", Some(9_223_372_036_854_775_807)),
    ("9223372036854775.807us", Some(9_223_372_036_854_775_807)),
    (
        "9223372036s854ms775us807ns",
        Some(9_223_372_036_854_775_807),
    ),
    ("0.100000000000000000000h", Some(360_000_000_000)),
    ("0.830103483285477580700h", Some(2_988_372_539_827)),
    ("", None),
    ("3", None),
    ("-", None),
    ("s", None),
    (".", None),
    ("-.", None),
    (".s", None),
    ("+.s", None),
    ("1d", None),
    ("5 s", None),
    ("9223372036854775808ns", None),
    ("9223372036854775.808us", None),
    ("9223372036854ms775us808ns", None),
    ("3000000h", None),
];

/// Go's `strconv.ParseBool`: `1 t T TRUE true True` and `0 f F FALSE false False`.
pub fn parse_bool(s: &str) -> Result<bool, SyntaxError> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(SyntaxError::NotABool),
    }
}

/// Go's `strconv.Unquote` for a double-quoted string (the escapes Kubernetes' downward API and
/// Go's `%q` emit). `None` when `s` is not one.
pub fn unquote(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let e = chars.next()?;
                out.push(escape(e, &mut chars)?);
            }
            '"' | '\n' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// One Go string escape after its backslash: `e` is the escape letter and `rest` yields what
/// follows it (the digits of `\x`, `\u`, `\U` and octal `\NNN` are taken from it). `None` for an
/// unknown escape, bad digits or a code point that is not a char.
pub fn escape(e: char, rest: &mut impl Iterator<Item = char>) -> Option<char> {
    Some(match e {
        'n' => '\n',
        't' => '\t',
        'r' => '\r',
        '\\' => '\\',
        '"' => '"',
        '\'' => '\'',
        'a' => '\x07',
        'b' => '\x08',
        'f' => '\x0c',
        'v' => '\x0b',
        'x' | 'u' | 'U' => {
            let n = match e {
                'x' => 2,
                'u' => 4,
                _ => 8,
            };
            let digits: String = rest.take(n).collect();
            if digits.len() != n || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            char::from_u32(u32::from_str_radix(&digits, 16).ok()?)?
        }
        '0'..='7' => {
            let more: String = rest.take(2).collect();
            if more.len() != 2 || !more.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
                return None;
            }
            let v = u32::from_str_radix(&format!("{e}{more}"), 8).ok()?;
            if v > 255 {
                return None;
            }
            char::from_u32(v)?
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_follow_go() {
        for (text, want) in DURATION_CASES {
            let got = parse_duration(text).ok().map(|d| d.as_nanos() as u64);
            assert_eq!(got, *want, "{text:?}");
        }
    }

    #[test]
    fn duration_errors_say_why() {
        assert_eq!(parse_duration("5"), Err(SyntaxError::MissingUnit));
        assert_eq!(parse_duration(""), Err(SyntaxError::Empty));
        assert_eq!(parse_duration("-1s"), Err(SyntaxError::Negative));
        assert_eq!(
            parse_duration("5 parsecs"),
            Err(SyntaxError::UnknownUnit(" parsecs".into()))
        );
        assert_eq!(parse_duration("3000000h"), Err(SyntaxError::Overflow));
        assert_eq!(parse_duration(".s"), Err(SyntaxError::NotANumber));
    }

    #[test]
    fn bools_follow_go() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(t), Ok(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(f), Ok(false), "{f}");
        }
        for bad in ["", "yes", "on", "tRUE", " true", "2"] {
            assert_eq!(parse_bool(bad), Err(SyntaxError::NotABool), "{bad:?}");
        }
    }

    #[test]
    fn unquote_follows_go() {
        assert_eq!(unquote(r#""a\"b\nc\u00e9""#).as_deref(), Some("a\"b\ncé"));
        assert_eq!(unquote(r#""\x41\101\U0001F600""#).as_deref(), Some("AA😀"));
        assert_eq!(unquote(r#""""#).as_deref(), Some(""));
        assert_eq!(unquote("noquotes"), None);
        assert_eq!(unquote(r#""bad\q""#), None);
        assert_eq!(unquote(r#""\u12""#), None);
        assert_eq!(unquote(r#""a"b""#), None);
        assert_eq!(unquote("\"unterminated"), None);
    }
}
