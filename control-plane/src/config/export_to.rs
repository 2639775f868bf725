//! `exportTo`: which namespaces see a ServiceEntry, VirtualService or DestinationRule (its
//! `spec.exportTo`), or a Kubernetes Service (its `networking.istio.io/exportTo` annotation,
//! comma-separated).
//!
//! Each entry is `*` (every namespace), `.` (the object's own namespace), `~` (none; alone) or
//! a namespace name. Empty is the mesh default, every namespace (`defaultServiceExportTo`,
//! `defaultVirtualServiceExportTo`, `defaultDestinationRuleExportTo`, all `*` unless set).

/// The Kubernetes Service annotation.
pub const ANNOTATION: &str = "networking.istio.io/exportTo";

/// Whether an object in `owner_ns` exported to `export_to` is seen by proxies in `proxy_ns`.
pub fn visible(export_to: &[String], owner_ns: &str, proxy_ns: &str) -> bool {
    export_to.is_empty()
        || export_to
            .iter()
            .any(|e| e == "*" || e == proxy_ns || (e == "." && owner_ns == proxy_ns))
}

/// The entries of the annotation's value (spaces around entries ignored, empty ones skipped).
pub fn parse_annotation(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect()
}

/// Checks `entries` as Istio's validation does; the error names `field[i]`.
pub fn check(field: &str, entries: &[String]) -> Result<(), (String, String)> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, e) in entries.iter().enumerate() {
        let at = || format!("{field}[{i}]");
        let ok = matches!(e.as_str(), "*" | "." | "~") || is_namespace(e);
        if !ok {
            return Err((
                at(),
                format!("{e:?} is not \"*\", \".\", \"~\" or a namespace name"),
            ));
        }
        if !seen.insert(e.as_str()) {
            return Err((at(), format!("duplicate entry {e:?}")));
        }
        if e == "~" && entries.len() > 1 {
            return Err((
                at(),
                "\"~\" (exported nowhere) must be the only entry".into(),
            ));
        }
    }
    Ok(())
}

/// A DNS-1123 label, as namespace names are.
fn is_namespace(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn visibility_follows_istio() {
        // (exportTo, owner namespace, proxy namespace, visible)
        let cases: &[(&[&str], &str, &str, bool)] = &[
            (&[], "a", "b", true),
            (&["*"], "a", "b", true),
            (&["."], "a", "a", true),
            (&["."], "a", "b", false),
            (&["b"], "a", "b", true),
            (&["b"], "a", "a", false),
            (&[".", "c"], "a", "c", true),
            (&[".", "c"], "a", "b", false),
            (&["~"], "a", "a", false),
        ];
        for (export_to, owner, proxy, want) in cases {
            assert_eq!(
                visible(&v(export_to), owner, proxy),
                *want,
                "{export_to:?} from {owner} to {proxy}"
            );
        }
    }

    #[test]
    fn annotation_is_comma_separated() {
        assert_eq!(
            parse_annotation(" ., istio-system ,"),
            v(&[".", "istio-system"])
        );
        assert!(parse_annotation("").is_empty());
    }

    #[test]
    fn bad_entries_name_the_field() {
        assert!(check("spec.exportTo", &v(&["*", ".", "ns-1"])).is_ok());
        assert!(check("spec.exportTo", &v(&["~"])).is_ok());
        let err = |entries: &[&str]| check("exportTo", &v(entries)).unwrap_err();
        assert_eq!(err(&["Bad_NS"]).0, "exportTo[0]");
        assert!(err(&["Bad_NS"]).1.contains("namespace name"));
        assert_eq!(
            err(&[".", "."]),
            ("exportTo[1]".into(), "duplicate entry \".\"".into())
        );
        assert_eq!(err(&["~", "a"]).0, "exportTo[0]");
        assert_eq!(err(&["a", "~"]).0, "exportTo[1]");
    }
}
