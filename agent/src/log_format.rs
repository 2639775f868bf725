//! The agent's log lines: Istio's `pkg/log` layout (`go_syntax::istio_log`, shared with
//! `istio-iptables`), with the scope column naming the Istio scope whose modules log the event
//! (`crate::log_scopes`).
//!
//! - Text: `<time>\t<level>\t<scope>\t<message>`, the event's fields appended after a tab as
//!   `key=value` pairs; the `default` scope has no column, as in Istio.
//! - JSON (`--log_as_json`): one object per line with `level`, `time`, `scope` (left out for
//!   `default`), `msg`, then the fields.

pub use go_syntax::istio_log::IstioFormat;

use crate::log_scopes;

/// The agent's format: text, or JSON with `json`, scopes from [`log_scopes::scope_of`].
pub fn istio_format(json: bool) -> IstioFormat {
    IstioFormat {
        json,
        scope: log_scopes::scope_of,
    }
}

#[cfg(test)]
mod tests {
    use go_syntax::istio_log::testing::{is_istio_time, parse_plain};

    use super::*;

    /// The lines `emit` logs through the agent's format, in `json` or text.
    fn lines(json: bool, emit: impl FnOnce()) -> Vec<String> {
        go_syntax::istio_log::testing::lines(istio_format(json), emit)
    }

    #[test]
    fn text_lines_read_as_istio_reads_them() {
        let out = lines(false, || {
            tracing::warn!(
                target: "agent::xds_proxy::streams",
                error = %"connection refused",
                attempt = 3,
                "upstream lost"
            );
            tracing::info!(target: "agent::app", "agent listeners bound");
            tracing::debug!(target: "sds::manager", "cache detail");
        });
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(
            !out.iter().any(|l| l.contains('\u{1b}')),
            "no colour: {out:?}"
        );

        let (time, level, text) = parse_plain(&out[0]).expect("Istio's reader takes it");
        assert!(is_istio_time(&time), "{time}");
        assert_eq!(level, "warn");
        // The scope column, then the message and its fields as Istio appends labels.
        assert_eq!(
            text,
            "xdsproxy\tupstream lost\terror=connection refused attempt=3"
        );
        let cols: Vec<&str> = out[0].split('\t').collect();
        assert_eq!(cols.len(), 5, "{cols:?}");
        assert_eq!(cols[2], "xdsproxy");

        // The default scope has no column, as in Istio.
        let cols: Vec<&str> = out[1].split('\t').collect();
        assert_eq!(cols[1..], ["info", "agent listeners bound"]);
        let (_, level, text) = parse_plain(&out[2]).unwrap();
        assert_eq!(
            (level.as_str(), text.as_str()),
            ("debug", "cache\tcache detail")
        );
    }

    #[test]
    fn json_lines_carry_istio_field_names() {
        let out = lines(true, || {
            tracing::error!(
                target: "sds::ca",
                addr = %"istiod:15012",
                retry = true,
                "CSR failed"
            );
            tracing::info!(target: "agent::app", "agent exiting");
        });
        assert_eq!(out.len(), 2, "{out:?}");
        // As `processlog.parseJSONLog` decodes it (and Istio's field names beside).
        #[derive(serde::Deserialize)]
        struct IstioJson {
            time: String,
            level: String,
            msg: String,
            scope: Option<String>,
        }
        let v: IstioJson = serde_json::from_str(&out[0]).unwrap();
        assert!(is_istio_time(&v.time), "{}", v.time);
        assert_eq!(v.level, "error");
        assert_eq!(v.msg, "CSR failed");
        assert_eq!(v.scope.as_deref(), Some("citadelclient"));
        let raw: serde_json::Value = serde_json::from_str(&out[0]).unwrap();
        assert_eq!(raw["addr"], "istiod:15012");
        assert_eq!(raw["retry"], true);
        // The default scope: no `scope` key, as Istio.
        let v: IstioJson = serde_json::from_str(&out[1]).unwrap();
        assert_eq!(
            (v.level.as_str(), v.msg.as_str()),
            ("info", "agent exiting")
        );
        assert!(v.scope.is_none());
    }
}
