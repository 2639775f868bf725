//! The merged metrics' formats, as Istio's agent negotiates them: the `Accept` passed on to
//! Envoy (text only) and to the app (text or OpenMetrics), rebuilt from the scraper's `Accept`
//! with only those types, in its order, with descending `q`; and the merged answer's
//! `Content-Type`, the app's format (OpenMetrics 1.0.0 or 0.0.1, else text).

use std::collections::{BTreeMap, HashSet};

/// The Prometheus text format, the fallback of every negotiation.
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
pub const OPENMETRICS_1_0_0: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const OPENMETRICS_0_0_1: &str = "application/openmetrics-text; version=0.0.1; charset=utf-8";
const OPENMETRICS: &str = "application/openmetrics-text";

/// The media types Envoy's `/stats/prometheus` is asked for.
pub const ENVOY_TYPES: &[&str] = &["text/*", "text/plain"];
/// The media types an app's metrics endpoint is asked for.
pub const APP_TYPES: &[&str] = &["text/*", "text/plain", OPENMETRICS];

/// One media range of an `Accept` header: the type (lower case) and its parameters but `q`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MediaType {
    kind: String,
    params: BTreeMap<String, String>,
}

impl MediaType {
    fn new(kind: &str, version: &str) -> MediaType {
        MediaType {
            kind: kind.to_string(),
            params: BTreeMap::from([("version".to_string(), version.to_string())]),
        }
    }

    /// The identity a media range is deduplicated by: type and parameters, `q` aside.
    fn key(&self) -> String {
        let mut s = self.kind.clone();
        for (k, v) in &self.params {
            s.push_str(&format!(";{k}={v}"));
        }
        s
    }
}

fn is_token_char(c: char) -> bool {
    c.is_ascii() && c > ' ' && c != '\x7f' && !"()<>@,;:\\\"/[]?=".contains(c)
}

fn token(s: &str) -> (&str, &str) {
    let end = s.find(|c| !is_token_char(c)).unwrap_or(s.len());
    s.split_at(end)
}

/// A parameter value: a token or a quoted string (with `\` escapes).
fn value(s: &str) -> Option<(String, &str)> {
    let Some(rest) = s.strip_prefix('"') else {
        let (v, rest) = token(s);
        return (!v.is_empty()).then(|| (v.to_string(), rest));
    };
    let mut out = String::new();
    let mut chars = rest.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &rest[i + 1..])),
            '\\' => out.push(chars.next()?.1),
            c => out.push(c),
        }
    }
    None
}

/// One media range (`type/subtype; k=v; ...`), read as Go's `mime.ParseMediaType`; `None` when
/// malformed.
fn parse_media_type(s: &str) -> Option<MediaType> {
    let (base, mut rest) = s
        .split_once(';')
        .map_or((s, ""), |(b, _)| (b, &s[b.len()..]));
    let kind = base.trim().to_ascii_lowercase();
    let (major, after) = token(&kind);
    if major.is_empty() {
        return None;
    }
    if !after.is_empty() {
        let (minor, tail) = token(after.strip_prefix('/')?);
        if minor.is_empty() || !tail.is_empty() {
            return None;
        }
    }
    let mut params = BTreeMap::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let p = rest.strip_prefix(';')?.trim_start();
        let (key, after_key) = token(p);
        if key.is_empty() {
            // Trailing semicolons are allowed.
            if p.trim().is_empty() || p.trim() == ";" {
                break;
            }
            return None;
        }
        let (v, after_value) = value(after_key.trim_start().strip_prefix('=')?.trim_start())?;
        if params.insert(key.to_ascii_lowercase(), v).is_some() {
            return None;
        }
        rest = after_value;
    }
    Some(MediaType { kind, params })
}

/// `type/subtype; k=v` with the parameters sorted and values quoted where they are not tokens
/// (Go's `mime.FormatMediaType`).
fn format_media_type(m: &MediaType) -> String {
    let mut s = m.kind.clone();
    for (k, v) in &m.params {
        s.push_str("; ");
        s.push_str(k);
        s.push('=');
        if !v.is_empty() && v.chars().all(is_token_char) {
            s.push_str(v);
        } else {
            s.push('"');
            for c in v.chars() {
                if c == '"' || c == '\\' {
                    s.push('\\');
                }
                s.push(c);
            }
            s.push('"');
        }
    }
    s
}

/// The `Accept` to send to a target that serves `allowed` types, from the scraper's `accept`:
/// its ranges of those types in its order (`*/*` and `*` standing for text 0.0.4,
/// `application/*` for OpenMetrics 0.0.1), each with a `q` below the one before; text 0.0.4
/// when none is left or the header does not parse.
pub fn allowed_content_types(accept: Option<&str>, allowed: &[&str]) -> String {
    let text = MediaType::new("text/plain", "0.0.4");
    let fallback = text.key();
    let parsed: Option<Vec<MediaType>> = accept
        .unwrap_or_default()
        .split(',')
        .map(parse_media_type)
        .collect();
    let Some(ranges) = parsed else {
        return fallback;
    };
    let mut used = HashSet::new();
    let mut chosen = Vec::new();
    for mut m in ranges {
        m.params.remove("q");
        let substitute = match m.kind.as_str() {
            "*/*" | "*" => Some((text.clone(), "text/plain")),
            "application/*" => Some((MediaType::new(OPENMETRICS, "0.0.1"), OPENMETRICS)),
            _ => None,
        };
        match substitute {
            Some((s, kind)) if allowed.contains(&kind) && used.insert(s.key()) => chosen.push(s),
            Some(_) => {}
            None if allowed.contains(&m.kind.as_str()) => {
                used.insert(m.key());
                chosen.push(m);
            }
            None => {}
        }
    }
    if chosen.is_empty() {
        return fallback;
    }
    let total = chosen.len();
    chosen
        .into_iter()
        .enumerate()
        .map(|(i, mut m)| {
            m.params.insert("q".into(), format!("0.{}", total - i));
            format_media_type(&m)
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The merged answer's format for an app that answered with `content_type`.
pub fn negotiate(content_type: Option<&str>) -> &'static str {
    let Some(m) = content_type.and_then(parse_media_type) else {
        return TEXT;
    };
    if m.kind != OPENMETRICS {
        return TEXT;
    }
    match m.params.get("version").map(String::as_str) {
        Some("1.0.0") => OPENMETRICS_1_0_0,
        Some("0.0.1") | None => OPENMETRICS_0_0_1,
        Some(_) => TEXT,
    }
}

/// The format of several apps' answers: the first's, unless a later one disagrees (then text).
pub fn negotiate_many<'a>(
    content_types: impl IntoIterator<Item = Option<&'a str>>,
) -> &'static str {
    let mut format = None;
    for ct in content_types {
        let f = negotiate(ct);
        match format {
            None => format = Some(f),
            Some(first) if first != f => return TEXT,
            Some(_) => {}
        }
    }
    format.unwrap_or(TEXT)
}

/// `body` without a trailing `# EOF` line (trailing whitespace around it tolerated), or as it
/// was.
pub fn strip_eof(body: &[u8]) -> &[u8] {
    let end = body
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        .map_or(0, |i| i + 1);
    let trimmed = &body[..end];
    match trimmed.strip_suffix(b"# EOF") {
        Some(rest) => rest,
        None => body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMETHEUS_3: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

    #[test]
    fn accept_keeps_the_targets_types_in_order() {
        assert_eq!(
            allowed_content_types(Some(PROMETHEUS_3), APP_TYPES),
            "application/openmetrics-text; q=0.3; version=1.0.0,application/openmetrics-text; q=0.2; version=0.0.1,text/plain; q=0.1; version=0.0.4"
        );
        assert_eq!(
            allowed_content_types(Some(PROMETHEUS_3), ENVOY_TYPES),
            "text/plain; q=0.1; version=0.0.4"
        );
        assert_eq!(
            allowed_content_types(Some("application/*"), APP_TYPES),
            "application/openmetrics-text; q=0.1; version=0.0.1"
        );
        assert_eq!(
            allowed_content_types(
                Some("text/plain;version=1.0.0;escaping=allow-utf-8;q=0.6,*/*;q=0.1"),
                ENVOY_TYPES
            ),
            "text/plain; escaping=allow-utf-8; q=0.2; version=1.0.0,text/plain; q=0.1; version=0.0.4"
        );
    }

    #[test]
    fn accept_falls_back_to_text() {
        for accept in [None, Some(";;;"), Some("application/json"), Some("a/b/c")] {
            assert_eq!(
                allowed_content_types(accept, APP_TYPES),
                "text/plain;version=0.0.4",
                "{accept:?}"
            );
        }
    }

    #[test]
    fn content_type_follows_the_app() {
        assert_eq!(negotiate(Some(OPENMETRICS_1_0_0)), OPENMETRICS_1_0_0);
        assert_eq!(
            negotiate(Some("application/openmetrics-text")),
            OPENMETRICS_0_0_1
        );
        assert_eq!(
            negotiate(Some("application/openmetrics-text; version=2.0.0")),
            TEXT
        );
        assert_eq!(negotiate(Some("text/plain")), TEXT);
        assert_eq!(negotiate(None), TEXT);
        assert_eq!(
            negotiate_many([Some(OPENMETRICS_1_0_0), Some("text/plain")]),
            TEXT
        );
        assert_eq!(
            negotiate_many([Some(OPENMETRICS_1_0_0), Some(OPENMETRICS_1_0_0)]),
            OPENMETRICS_1_0_0
        );
    }

    #[test]
    fn only_a_trailing_eof_is_stripped() {
        assert_eq!(strip_eof(b"a 1\n# EOF\n"), b"a 1\n");
        assert_eq!(strip_eof(b"a 1\n# EOF\r\n  "), b"a 1\n");
        assert_eq!(strip_eof(b"a 1\n"), b"a 1\n");
        assert_eq!(strip_eof(b"# EOF\nb 2\n"), b"# EOF\nb 2\n");
    }
}
