//! Content negotiation of the merged metrics, as Istio's agent does it: the scraper's `Accept`
//! header filtered to what a target may answer (Envoy: text only; the app: text or
//! OpenMetrics), and the merged answer's `Content-Type` taken from the app's answers.

/// Prometheus text 0.0.4: what a target is asked for when nothing else is usable.
const TEXT_004: &str = "text/plain;version=0.0.4";
pub const OPENMETRICS: &str = "application/openmetrics-text";

/// The merged answer's `Content-Type`s (Istio's `FmtText`, `FmtOpenMetrics_*`).
pub const FMT_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
pub const FMT_OPENMETRICS_0_0_1: &str =
    "application/openmetrics-text; version=0.0.1; charset=utf-8";
pub const FMT_OPENMETRICS_1_0_0: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The media types Envoy's `/stats/prometheus` is asked for: it writes no OpenMetrics `# EOF`.
pub const ENVOY_TYPES: &[&str] = &["text/*", "text/plain"];
/// The media types an application target is asked for.
pub const APP_TYPES: &[&str] = &["text/*", "text/plain", OPENMETRICS];

/// One media range of an `Accept` header: lower-cased type, parameters in order (without `q`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct MediaRange {
    mediatype: String,
    params: Vec<(String, String)>,
}

impl MediaRange {
    /// The identity of a range for de-duplication: type and sorted parameters.
    fn key(&self) -> String {
        let mut params: Vec<String> = self
            .params
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        params.sort();
        std::iter::once(self.mediatype.clone())
            .chain(params)
            .collect::<Vec<_>>()
            .join(";")
    }

    fn text_004() -> Self {
        MediaRange {
            mediatype: "text/plain".into(),
            params: vec![("version".into(), "0.0.4".into())],
        }
    }

    fn openmetrics_001() -> Self {
        MediaRange {
            mediatype: OPENMETRICS.into(),
            params: vec![("version".into(), "0.0.1".into())],
        }
    }
}

fn is_token_char(c: char) -> bool {
    c.is_ascii() && !c.is_ascii_control() && !" ()<>@,;:\\\"/[]?=".contains(c)
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_token_char)
}

/// Parses one media range the way Go's `mime.ParseMediaType` does (`type[/subtype]`, then
/// `;key=value` with token or quoted-string values; a trailing `;` is allowed).
fn parse_range(s: &str) -> Option<MediaRange> {
    let mut parts = s.split(';');
    let mediatype = parts.next()?.trim().to_ascii_lowercase();
    let (major, minor) = match mediatype.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (mediatype.as_str(), None),
    };
    if !is_token(major) || minor.is_some_and(|m| !is_token(m)) {
        return None;
    }
    let mut params: Vec<(String, String)> = Vec::new();
    let rest: Vec<&str> = parts.collect();
    for (i, p) in rest.iter().enumerate() {
        let p = p.trim();
        if p.is_empty() {
            // Only a trailing `;` is tolerated.
            if i + 1 == rest.len() {
                break;
            }
            return None;
        }
        let (k, v) = p.split_once('=')?;
        let k = k.trim().to_ascii_lowercase();
        let v = v.trim();
        let v = if let Some(q) = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            q.replace("\\\"", "\"")
        } else if is_token(v) {
            v.to_string()
        } else {
            return None;
        };
        if !is_token(&k) || params.iter().any(|(pk, _)| *pk == k) {
            return None;
        }
        params.push((k, v));
    }
    Some(MediaRange { mediatype, params })
}

/// Formats a range as Go's `mime.FormatMediaType` does: parameters sorted, `; ` between them,
/// values quoted when they are not tokens.
fn format_range(mediatype: &str, params: &[(String, String)]) -> String {
    let mut params = params.to_vec();
    params.sort();
    let mut out = mediatype.to_string();
    for (k, v) in params {
        out.push_str("; ");
        out.push_str(&k);
        out.push('=');
        if is_token(&v) {
            out.push_str(&v);
        } else {
            out.push('"');
            out.push_str(&v.replace('\\', "\\\\").replace('"', "\\\""));
            out.push('"');
        }
    }
    out
}

/// The `Accept` header sent to a target: the scraper's ranges that `allowed` lists, in the
/// scraper's order, with descending `q` values (`*/*` stands for text 0.0.4 and
/// `application/*` for OpenMetrics 0.0.1). An unparsable or empty header, or one naming
/// nothing allowed, asks for text 0.0.4.
pub fn target_accept(accept: Option<&str>, allowed: &[&str]) -> String {
    let Some(ranges) = accept
        .unwrap_or("")
        .split(',')
        .map(parse_range)
        .collect::<Option<Vec<_>>>()
    else {
        return TEXT_004.to_string();
    };
    let mut used = std::collections::HashSet::new();
    let mut kept: Vec<MediaRange> = Vec::new();
    for mut r in ranges {
        r.params.retain(|(k, _)| k != "q");
        let r = match r.mediatype.as_str() {
            "*/*" | "*" => MediaRange::text_004(),
            "application/*" => MediaRange::openmetrics_001(),
            _ => r,
        };
        if !allowed.contains(&r.mediatype.as_str()) || !used.insert(r.key()) {
            continue;
        }
        kept.push(r);
    }
    if kept.is_empty() {
        return TEXT_004.to_string();
    }
    let total = kept.len();
    kept.into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r.params.push(("q".into(), format!("0.{}", total - i)));
            format_range(&r.mediatype, &r.params)
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The merged answer's format for one target's `Content-Type` (Istio's
/// `negotiateMetricsFormat`): OpenMetrics 1.0.0 or 0.0.1 when the app answered it, else text.
pub fn format_of(content_type: Option<&str>) -> &'static str {
    match content_type.and_then(parse_range) {
        Some(r) if r.mediatype == OPENMETRICS => {
            match r
                .params
                .iter()
                .find(|(k, _)| k == "version")
                .map(|(_, v)| v.as_str())
            {
                Some("1.0.0") => FMT_OPENMETRICS_1_0_0,
                Some("0.0.1") | Some("") | None => FMT_OPENMETRICS_0_0_1,
                Some(_) => FMT_TEXT,
            }
        }
        _ => FMT_TEXT,
    }
}

/// The merged answer's format from the targets that answered, in target order: the first
/// one's, unless a later one disagrees (then text, as a body claiming OpenMetrics with text
/// in it is invalid); text when none answered.
pub fn merged_format<'a>(answered: impl IntoIterator<Item = Option<&'a str>>) -> &'static str {
    let mut format = None;
    for ct in answered {
        let f = format_of(ct);
        match format {
            None => format = Some(f),
            Some(prev) if prev != f => return FMT_TEXT,
            Some(_) => {}
        }
    }
    format.unwrap_or(FMT_TEXT)
}

pub fn is_openmetrics(format: &str) -> bool {
    format.starts_with(OPENMETRICS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prometheus 3's scrape `Accept` header (with protobuf, as with native histograms).
    const PROMETHEUS: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,\
        application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,\
        application/openmetrics-text;version=0.0.1;q=0.4,\
        text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,\
        text/plain;version=0.0.4;q=0.2,*/*;q=0.1";

    #[test]
    fn the_app_is_asked_for_what_the_scraper_accepts_less_protobuf() {
        assert_eq!(
            target_accept(Some(PROMETHEUS), APP_TYPES),
            "application/openmetrics-text; escaping=allow-utf-8; q=0.4; version=1.0.0,\
             application/openmetrics-text; q=0.3; version=0.0.1,\
             text/plain; escaping=allow-utf-8; q=0.2; version=1.0.0,\
             text/plain; q=0.1; version=0.0.4"
        );
    }

    #[test]
    fn envoy_is_asked_for_text_only() {
        assert_eq!(
            target_accept(Some(PROMETHEUS), ENVOY_TYPES),
            "text/plain; escaping=allow-utf-8; q=0.2; version=1.0.0,\
             text/plain; q=0.1; version=0.0.4"
        );
    }

    #[test]
    fn wildcards_ranges_and_bad_headers() {
        // `*/*` is text 0.0.4, `application/*` OpenMetrics 0.0.1.
        assert_eq!(
            target_accept(Some("*/*"), APP_TYPES),
            "text/plain; q=0.1; version=0.0.4"
        );
        assert_eq!(
            target_accept(Some("application/*"), APP_TYPES),
            "application/openmetrics-text; q=0.1; version=0.0.1"
        );
        assert_eq!(target_accept(Some("application/*"), ENVOY_TYPES), TEXT_004);
        // Protobuf only, nothing, garbage: text 0.0.4.
        assert_eq!(
            target_accept(
                Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily"),
                APP_TYPES
            ),
            TEXT_004
        );
        assert_eq!(target_accept(None, APP_TYPES), TEXT_004);
        assert_eq!(target_accept(Some("/"), APP_TYPES), TEXT_004);
        assert_eq!(
            target_accept(Some("text/plain;version"), APP_TYPES),
            TEXT_004
        );
        // A repeated range is asked for once; a trailing `;` is fine.
        assert_eq!(
            target_accept(Some("text/plain;version=0.0.4;,*/*"), APP_TYPES),
            "text/plain; q=0.1; version=0.0.4"
        );
    }

    #[test]
    fn the_answer_takes_the_apps_format() {
        for (ct, want) in [
            (
                "application/openmetrics-text; version=0.0.1",
                FMT_OPENMETRICS_0_0_1,
            ),
            (
                "application/openmetrics-text; version=1.0.0",
                FMT_OPENMETRICS_1_0_0,
            ),
            (
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                FMT_OPENMETRICS_1_0_0,
            ),
            ("application/openmetrics-text", FMT_OPENMETRICS_0_0_1),
            ("application/openmetrics-text; version=2.0.0", FMT_TEXT),
            ("text/plain; version=0.0.4", FMT_TEXT),
            ("garbage/", FMT_TEXT),
        ] {
            assert_eq!(format_of(Some(ct)), want, "{ct}");
        }
        assert_eq!(format_of(None), FMT_TEXT);
    }

    #[test]
    fn several_targets_agree_or_fall_back_to_text() {
        let om = Some("application/openmetrics-text; version=1.0.0");
        let text = Some("text/plain; version=0.0.4");
        assert_eq!(merged_format([om, om]), FMT_OPENMETRICS_1_0_0);
        assert_eq!(merged_format([om, text]), FMT_TEXT);
        assert_eq!(merged_format([text, om]), FMT_TEXT);
        assert_eq!(merged_format([]), FMT_TEXT);
    }
}
